function (doc) {
  // Live jobs whose current step is running, by the site running it.
  // (Defaults: docs/job-document.md.)
  var index = doc.step == null ? 0 : doc.step;
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(index < doc.job.length)) {
    return;
  }
  var step = doc.job[index];
  if (step.runs !== null && typeof step.runs === "object") {
    // A broadcast step: one row per site running its own part.
    Object.keys(step.runs).forEach(function (site) {
      var run = step.runs[site];
      if (run && run.status === "running") {
        emit([site, run.start_time == null ? null : run.start_time],
             {step: index, executioner: run.executioner == null ? null : run.executioner,
              progress: run.progress == null ? null : run.progress});
      }
    });
  } else if (step.step_status === "running") {
    var started = step.start_time == null ? null : step.start_time;
    var executioner = step.executioner == null ? null : step.executioner;
    // The command's last progress report ({fraction, message, at}), or null.
    var progress = step.progress == null ? null : step.progress;
    emit([step.winner, started], {step: index, executioner: executioner, progress: progress});
  }
}
