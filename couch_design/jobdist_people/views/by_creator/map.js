function (doc) {
  // Jobs by creator, then status ("live" until the job ends,
  // "waiting" while it waits), then creation
  // time: `jobdist list --creator SITE [--status S]` reads one status range
  // per status, newest first. The value is the row `jobdist list` shows.
  // A field left out takes its default (docs/job-document.md); a creation time
  // the creator has not stamped yet is "".
  if (doc.type !== "job" || !Array.isArray(doc.job) || doc.job.length === 0) {
    return;
  }
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  var status = doc.job_status || (held ? "waiting" : "live");
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
