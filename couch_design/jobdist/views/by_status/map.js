function (doc) {
  // Every job by its final status, or "live" while it has none.
  if (doc.type !== "job") {
    return;
  }
  emit([doc.job_status || "live", doc.created_at], null);
}
