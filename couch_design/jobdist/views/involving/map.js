function (doc) {
  // Live jobs, once per site with a part in the current step (its creator, the
  // claimer, the winner): what a restarting site must re-decide.
  // (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  var sites = [];
  [doc.creator, step.claimed_by, step.winner].forEach(function (site) {
    if (typeof site === "string" && sites.indexOf(site) === -1) {
      sites.push(site);
    }
  });
  sites.forEach(function (site) {
    emit(site, null);
  });
}
