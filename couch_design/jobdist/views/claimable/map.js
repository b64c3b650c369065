function (doc) {
  // Live jobs whose current step is open (nobody claimed, won or ran it), one row
  // per target so that a site reads its own rows and the "any" rows, best first.
  if (doc.type !== "job" || doc.job_status != null || !Array.isArray(doc.job) ||
      !(doc.step < doc.job.length)) {
    return;
  }
  var step = doc.job[doc.step];
  if (step.claimed_by != null || step.winner != null || step.step_status != null) {
    return;
  }
  var targets = Array.isArray(step.target) ? step.target : [step.target];
  var value = {step: doc.step, epoch: step.epoch || 0};
  // `|| 0` turns -0 into 0 for priority 0.
  var rank = -doc.priority || 0;
  targets.forEach(function (target) {
    emit([target, rank, doc.created_at], value);
  });
}
