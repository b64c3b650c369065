function (doc) {
  // Jobs by every site they concern, then status ("live" until the job ends,
  // "waiting" while it waits),
  // then creation time: a site concerns a job when a step targets it by name
  // (alone or in a list; "any", the default target, names no site), is won by
  // it, or was started there (history). `jobdist list --site SITE [--status S]`,
  // newest first. A field left out takes its default (docs/job-document.md); a
  // creation time the creator has not stamped yet is "".
  if (doc.type !== "job" || !Array.isArray(doc.job) || doc.job.length === 0) {
    return;
  }
  var sites = [];
  function add(site) {
    if (typeof site === "string" && site !== "any" && site !== "all" &&
        sites.indexOf(site) === -1) {
      sites.push(site);
    }
  }
  doc.job.forEach(function (step) {
    var targets = Array.isArray(step.target) ? step.target : [step.target];
    targets.forEach(add);
    add(step.winner);
    if (step.runs !== null && typeof step.runs === "object") {
      Object.keys(step.runs).forEach(add);  // a broadcast's sites ("all" names none)
    }
  });
  (Array.isArray(doc.history) ? doc.history : []).forEach(function (entry) {
    if (entry && entry.event === "started") {
      add(entry.site);
    }
  });
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  var status = doc.job_status || (held ? "waiting" : "live");
  var index = doc.step == null ? 0 : doc.step;
  var current = doc.job[Math.min(index, doc.job.length - 1)] || {};
  var value = {
    status: status,
    creator: doc.creator,
    priority: doc.priority == null ? 0 : doc.priority,
    step: index,
    steps: doc.job.length,
    updated_at: doc.updated_at || null,
    command: String(current["do"]).slice(0, 120),
    fan_out: fanOut(current)
  };
  sites.forEach(function (site) {
    emit([site, status, doc.created_at || ""], value);
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
