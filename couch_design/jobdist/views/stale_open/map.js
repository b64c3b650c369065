function (doc) {
  // Live jobs whose current step is open, keyed by when anyone last touched them,
  // so the creator finds those nobody has picked up for a while.
  // (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  if (step.claimed_by != null || step.winner != null || step.step_status != null) {
    return;
  }
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  if (held) {
    return;  // until its creator releases it
  }
  // ISO 8601 UTC times in one format compare as strings. Never written by a
  // site: the creation time, if the submitter gave one (core.keepalive alike).
  var touched = doc.updated_at || doc.created_at || "";
  if (typeof doc.keepalive_at === "string" && doc.keepalive_at > touched) {
    touched = doc.keepalive_at;
  }
  // Priority and creation time: readers order rows by core.claim_rank. The step's
  // target: the keep-alive re-saves a job only for a site with a free worker.
  emit([doc.creator, touched], {priority: doc.priority == null ? 0 : doc.priority,
                                created_at: doc.created_at == null ? null : doc.created_at,
                                target: step.target == null ? "any" : step.target});
}
