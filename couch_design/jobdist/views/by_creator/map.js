function (doc) {
  // Jobs by creator, then status ("live" until the job ends), then creation
  // time: `jobdist list --creator SITE [--status S]` reads one status range
  // per status, newest first. The value is the row `jobdist list` shows.
  if (doc.type !== "job" || !Array.isArray(doc.job) || doc.job.length === 0) {
    return;
  }
  var status = doc.job_status || "live";
  var current = doc.job[Math.min(doc.step, doc.job.length - 1)] || {};
  emit([doc.creator, status, doc.created_at], {
    status: status,
    creator: doc.creator,
    priority: doc.priority,
    step: doc.step,
    steps: doc.job.length,
    updated_at: doc.updated_at,
    command: String(current["do"]).slice(0, 120)
  });
}
