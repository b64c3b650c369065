function (doc) {
  // Steps a site promised to run (won or running), by creator and lease deadline:
  // the creator revokes the ones whose lease ran out.
  if (doc.type !== "job" || doc.job_status !== null || doc.step >= doc.job.length) {
    return;
  }
  var step = doc.job[doc.step];
  if (step.winner && step.lease_until &&
      (step.step_status === null || step.step_status === undefined || step.step_status === "running")) {
    emit([doc.creator, step.lease_until], {step: doc.step, winner: step.winner});
  }
}
