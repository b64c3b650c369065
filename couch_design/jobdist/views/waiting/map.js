function (doc) {
  // Live jobs that wait, by creator and creation time, with what they wait for: the
  // creator re-checks its own (jobdist/manager.py); Fauxton shows why a job waits.
  // (Defaults: docs/job-document.md; a job without `after_policy` waits for success.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  if (held) {
    emit([doc.creator, doc.created_at || ""], {
      after: Array.isArray(doc.after) ? doc.after : [],
      after_policy: doc.after_policy == null ? "success" : doc.after_policy,
      not_before: doc.not_before == null ? null : doc.not_before
    });
  }
}
