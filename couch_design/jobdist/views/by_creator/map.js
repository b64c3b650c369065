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
    command: String(current["do"]).slice(0, 120),
    fan_out: fanOut(current)
  });

  // A broadcast step's fan-out, "done/sites" (dropped sites left out); null otherwise.
  function fanOut(step) {
    if (step.runs === null || typeof step.runs !== "object") {
      return null;
    }
    var dropped = Array.isArray(step.dropped) ? step.dropped : [];
    var sites = Object.keys(step.runs).filter(function (site) {
      return dropped.indexOf(site) === -1;
    });
    var done = sites.filter(function (site) {
      var run = step.runs[site] || {};
      return run.status === "finished" || run.status === "failed";
    });
    return done.length + "/" + sites.length;
  }
}
