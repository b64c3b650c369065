function (doc) {
  // Live jobs, once per site with a part in the current step (its creator, the
  // claimer, the winner, a broadcast's sites): what a restarting site must re-decide.
  // (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  var sites = [];
  // A broadcast step: every site of its set has its own part in it.
  var parts = step.runs !== null && typeof step.runs === "object" ? Object.keys(step.runs) : [];
  [doc.creator, step.claimed_by, step.winner].concat(parts).forEach(function (site) {
    if (typeof site === "string" && sites.indexOf(site) === -1) {
      sites.push(site);
    }
  });
  sites.forEach(function (site) {
    emit(site, null);
  });
}
