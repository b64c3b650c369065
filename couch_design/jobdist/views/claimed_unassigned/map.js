function (doc) {
  // Live jobs whose current step a site claimed and the creator has not yet
  // given a winner: the creator's work to do.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  var step = doc.job[doc.step];
  if (step.claimed_by != null && step.winner == null) {
    emit([doc.creator, doc.created_at], step.claimed_by);
  }
}
