function (doc) {
  // Live jobs whose current step is open, keyed by when anyone last touched them,
  // so the creator finds those nobody has picked up for a while.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  var step = doc.job[doc.step];
  if (step.claimed_by != null || step.winner != null || step.step_status != null) {
    return;
  }
  // ISO 8601 UTC times in one format compare as strings.
  var touched = doc.updated_at;
  if (typeof doc.keepalive_at === "string" && doc.keepalive_at > touched) {
    touched = doc.keepalive_at;
  }
  emit([doc.creator, touched], {priority: doc.priority});
}
