function (doc) {
  // Live jobs whose current step is open (nobody claimed, won or ran it), one row
  // per target so that a site reads its own rows and the "any" rows, best first.
  // A field left out takes its default (docs/job-document.md): step 0, priority 0,
  // target "any"; a creation time the creator has not stamped yet is "".
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  // A job that waits (jobdist/model.py is_waiting): it names jobs to wait for or a time not
  // to start before, and its creator has not released it yet (a "ready" event).
  var held = ((Array.isArray(doc.after) && doc.after.length > 0) || !!doc.not_before) &&
    !(Array.isArray(doc.history) && doc.history.some(function (entry) {
      return entry != null && entry.event === "ready";
    }));
  if (held) {
    return;  // until its creator releases it
  }
  var targets;
  if (step.runs !== null && typeof step.runs === "object" && step.step_status === "running") {
    // An opened broadcast step: a row per site whose own part waits to start.
    var dropped = Array.isArray(step.dropped) ? step.dropped : [];
    targets = Object.keys(step.runs).filter(function (site) {
      var run = step.runs[site];
      return run !== null && typeof run === "object" && run.status == null &&
        dropped.indexOf(site) === -1;
    });
  } else if (step.claimed_by != null || step.winner != null || step.step_status != null ||
             step.target === "all" || step.each === true) {
    return;  // taken, or a broadcast step its creator has not opened yet
  } else {
    var target = step.target == null ? "any" : step.target;
    targets = Array.isArray(target) ? target : [target];
  }
  var value = {step: index, epoch: step.epoch || 0};
  // The rank: floor(creation second / 10) - priority, lower first; waiting 10 s
  // is worth one priority level (core.claim_rank, docs/protocol.md: the same
  // arithmetic, so every site orders alike). No creation time yet: last.
  var priority = typeof doc.priority === "number" && Math.floor(doc.priority) === doc.priority
    ? doc.priority : 0;
  var parts = typeof doc.created_at === "string" &&
    /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?Z$/.exec(doc.created_at);
  var band = 9007199254740991;
  if (parts) {
    var moment = new Date(0);  // setUTCFullYear, not Date.UTC: years below 100 stay as written
    moment.setUTCFullYear(+parts[1], +parts[2] - 1, +parts[3]);
    moment.setUTCHours(+parts[4], +parts[5], +parts[6]);
    band = Math.floor(moment.getTime() / 10000);
  }
  // `|| 0` turns -0 into 0.
  var rank = (band - priority) || 0;
  targets.forEach(function (site) {
    emit([site, rank, doc.created_at || ""], value);
  });
}
