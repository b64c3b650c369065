function (doc, req) {
  // Jobs, sites' status documents, schedules, and deletions (which keep no fields) so that
  // conflict deletions replicate. Design documents stay at their site: each
  // site uploads its own.
  if (doc._id.indexOf("_design/") === 0) {
    return false;
  }
  return doc._deleted === true || doc.type === "job" || doc.type === "site" ||
    doc.type === "schedule";
}
