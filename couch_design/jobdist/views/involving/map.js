function (doc) {
  // Live jobs, once per site with a part in the current step (its creator, the
  // claimer, the winner): what a restarting site must re-decide.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  var step = doc.job[doc.step];
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
