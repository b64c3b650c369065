function (doc) {
  // Schedules by owner site and name (jobdist/schedules.py); defaults filled in.
  if (doc.type !== "schedule") {
    return;
  }
  emit([doc.owner, doc.name], {
    cron: doc.cron,
    timezone: doc.timezone == null ? "UTC" : doc.timezone,
    enabled: doc.enabled !== false,
    missed: doc.missed == null ? "latest" : doc.missed,
    updated_at: doc.updated_at
  });
}
