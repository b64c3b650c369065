function (doc) {
  // Every job by its final status, or "live" while it has none; then creation
  // time ("" until the creator stamps it: docs/job-document.md).
  if (doc.type !== "job") {
    return;
  }
  emit([doc.job_status || "live", doc.created_at || ""], null);
}
