function (doc) {
  // Live jobs whose current step is running, by the site running it.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  var step = doc.job[doc.step];
  if (step.step_status === "running") {
    emit([step.winner, step.start_time], {step: doc.step, executioner: step.executioner});
  }
}
