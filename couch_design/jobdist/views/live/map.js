function (doc) {
  // Every live job: no final status yet, and a current step still to run.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  emit([doc.creator, doc.created_at], null);
}
