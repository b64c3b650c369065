function (doc) {
  // Finished jobs (success, failed, cancelled) by their last update: the jobs
  // `jobdist cleanup --older-than PERIOD` removes are the rows before a time.
  if (doc.type !== "job") {
    return;
  }
  var status = doc.job_status;
  if (status === "success" || status === "failed" || status === "cancelled") {
    emit(doc.updated_at, {status: status, creator: doc.creator});
  }
}
