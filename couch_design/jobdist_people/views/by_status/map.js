function (doc) {
  // Every job by its final status, or "waiting" or "live" while it has none; then creation
  // time ("" until the creator stamps it: docs/job-document.md).
  if (doc.type !== "job") {
    return;
  }
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  emit([doc.job_status || (held ? "waiting" : "live"), doc.created_at || ""], null);
}
