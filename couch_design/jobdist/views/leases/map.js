function (doc) {
  // Steps a site promised to run (won or running), by creator and lease deadline:
  // the creator revokes the ones whose lease ran out. (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  if (step.winner && step.lease_until &&
      (step.step_status == null || step.step_status === "running")) {
    emit([doc.creator, step.lease_until], {step: index, winner: step.winner});
  }
  // A broadcast step: each site's running part has a lease of its own.
  if (step.runs !== null && typeof step.runs === "object" && step.step_status === "running") {
    Object.keys(step.runs).forEach(function (site) {
      var run = step.runs[site];
      if (run && run.status === "running" && run.lease_until) {
        emit([doc.creator, run.lease_until], {step: index, winner: site});
      }
    });
  }
}
