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
  if (step.claimed_by != null || step.winner != null || step.step_status != null) {
    return;
  }
  var target = step.target == null ? "any" : step.target;
  var targets = Array.isArray(target) ? target : [target];
  var value = {step: index, epoch: step.epoch || 0};
  // `|| 0` turns -0 into 0 for priority 0.
  var rank = -(doc.priority == null ? 0 : doc.priority) || 0;
  targets.forEach(function (site) {
    emit([site, rank, doc.created_at || ""], value);
  });
}
