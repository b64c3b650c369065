function (doc) {
  // Every live job: no final status yet, and a current step still to run.
  // (Defaults: docs/job-document.md; "" for a creation time not stamped yet.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  emit([doc.creator, doc.created_at || ""], null);
}
