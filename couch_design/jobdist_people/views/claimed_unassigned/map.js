function (doc) {
  // Live jobs whose current step a site claimed and the creator has not yet
  // given a winner: the creator's work to do. (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  if (step.claimed_by != null && step.winner == null) {
    emit([doc.creator, doc.created_at || ""], step.claimed_by);
  }
}
