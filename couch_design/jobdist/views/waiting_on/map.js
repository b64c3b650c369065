function (doc) {
  // Each job a live waiting job waits for (key), the waiting job as the row's id and
  // its creator as the value: when a job ends, its creator's manager wakes the jobs
  // waiting on it in the same batch (jobdist/manager.py), with no polling per job.
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length) || !Array.isArray(doc.after)) {
    return;
  }
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  if (held) {
    doc.after.forEach(function (awaited) {
      emit(awaited, doc.creator);
    });
  }
}
