function (doc, req) {
  // Replicate to a site only the jobs that concern it: those it created and
  // those with a step it may run (a broadcast to "all" runs everywhere), every site's status and every schedule (a few
  // small documents that any site may be asked to show or take over). Deletions carry no
  // fields: always pass them.
  if (doc._id.indexOf("_design/") === 0) {
    return false;
  }
  if (doc._deleted || doc.type === "site" || doc.type === "schedule") {
    return true;  // every site's status concerns every creator
  }
  if (doc.type !== "job") {
    return false;
  }
  var site = req.query.site;
  if (!site || doc.creator === site) {
    return true;
  }
  for (var i = 0; i < doc.job.length; i++) {
    var target = doc.job[i].target == null ? "any" : doc.job[i].target;  // its default
    var wanted = typeof target === "string" ? [target] : target;
    for (var j = 0; j < wanted.length; j++) {
      if (wanted[j] === "any" || wanted[j] === "all" || wanted[j] === site) {
        return true;
      }
    }
  }
  return false;
}
