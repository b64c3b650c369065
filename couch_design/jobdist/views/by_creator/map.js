function (doc) {
  // Jobs by creator, then status ("live" until the job ends), then creation
  // time: `jobdist list --creator SITE [--status S]` reads one status range
  // per status, newest first. The value is the row `jobdist list` shows.
  // A field left out takes its default (docs/job-document.md); a creation time
  // the creator has not stamped yet is "".
  if (doc.type !== "job" || !Array.isArray(doc.job) || doc.job.length === 0) {
    return;
  }
  var status = doc.job_status || "live";
  var index = doc.step == null ? 0 : doc.step;
  var current = doc.job[Math.min(index, doc.job.length - 1)] || {};
  emit([doc.creator, status, doc.created_at || ""], {
    status: status,
    creator: doc.creator,
    priority: doc.priority == null ? 0 : doc.priority,
    step: index,
    steps: doc.job.length,
    updated_at: doc.updated_at || null,
    command: String(current["do"]).slice(0, 120)
  });
}
