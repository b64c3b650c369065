function (doc) {
  // Finished jobs (success, failed, cancelled) by their last update: the jobs
  // `jobdist cleanup --older-than PERIOD` removes are the rows before a time.
  // A job no site has written yet has no update time, hence no age: not listed.
  if (doc.type !== "job" || typeof doc.updated_at !== "string") {
    return;
  }
  var status = doc.job_status;
  if (status === "success" || status === "failed" || status === "cancelled") {
    emit(doc.updated_at, {status: status, creator: doc.creator});
  }
}
