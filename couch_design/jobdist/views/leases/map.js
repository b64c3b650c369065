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
}
