function (newDoc, oldDoc, userCtx, secObj) {
  // The job document's rules (docs/job-document.md). jobdist/validation.py
  // holds the same rules, in the same order and with the same messages: change
  // both together. ES5 only (CouchDB's and pouchdb-server's engines), and this
  // file must start with `function`: servers evaluate "return " + its text.
  "use strict";

  var MAX_DOC_SIZE = 1024 * 1024;
  var MAX_DEPTH = 32;  // levels of objects and lists; Python's JSON parser gives up near 1000
  var MAX_STEPS = 1000;
  var MAX_DO_LENGTH = 65536;
  var MAX_STREAM_LENGTH = 4096;
  var MAX_PROGRESS_MESSAGE = 200;  // characters of a step's progress message
  var MAX_ID_LENGTH = 256;
  // Counts stay far below 2**53: past it, JavaScript cannot add 1 and epochs stop growing.
  var MAX_COUNT = 1000000000;
  var MAX_RETRIES = 1000;

  var JOB_STATUSES = [null, "success", "failed", "cancelled"];
  // The newest job format this release knows (jobdist/model.py JOB_FORMAT).
  var JOB_FORMAT = 1;
  var STEP_STATUSES = [null, "running", "finished", "failed"];
  var HISTORY_EVENTS = [
    "created", "claimed", "won", "started", "retried", "finished", "failed",
    "released", "cancelled", "stale_finish", "invalid", "adopted", "ready", "opened",
    "dropped"
  ];
  // An event's machine-readable reason code (jobdist/model.py, Reason).
  var EVENT_REASONS = [
    "won_claim", "late_start", "no_worker", "no_worker_in_time", "queue_full", "win_lapsed",
    "start_lapsed", "waited_for", "alt_do"
  ];
  // Waiting (docs/job-document.md, "Waiting").
  var AFTER_POLICIES = ["success", "always"];
  var MAX_AFTER = 100;
  // Revision metadata the server adds to the document it validates: not measured.
  var UNMEASURED_FIELDS = ["_rev", "_revisions"];
  // CouchDB's own top-level members (it refuses any other name starting with _), not checked.
  var COUCHDB_FIELDS = [
    "_rev", "_revisions", "_conflicts", "_deleted_conflicts", "_deleted", "_attachments",
    "_revs_info", "_local_seq"
  ];
  // "Did you mean" hints only while fewer errors than this are found: finding the nearest
  // name costs work, and a document may hold 100,000 unknown fields.
  var MAX_HINTED_ERRORS = 20;
  var MAX_EDITS = 2;  // jobdist/names.py: the nearest name is at most this many edits away

  var SITE_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;
  var ISO_UTC = new RegExp(
    "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])" +
    "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?Z$"
  );

  var SITE_NAME_RULE =
    "a site name (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)";
  var SITE_NAME_REASON = "must be " + SITE_NAME_RULE;
  var ISO_UTC_RULE = "an ISO 8601 UTC time ending in Z (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)";
  var ISO_UTC_REASON = "must be " + ISO_UTC_RULE;
  var TARGET_REASON = 'must be "any", a site name or a non-empty list of site names';
  var CONTROL_CHARACTER = /[\u0000-\u001f\u007f]/;
  // A high surrogate not followed by a low one, or a low one not preceded by a high one.
  var LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(^|[^\ud800-\udbff])[\udc00-\udfff]/;
  var ID_REASON = "must be a string of 1-" + MAX_ID_LENGTH + " characters, without control " +
    "characters or unpaired surrogates";
  var DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

  // Defaults of the fields a job may leave out: a job written over HTTP need hold only
  // what its submitter writes. jobdist/model.py holds the same tables (each ends with
  // "};" at the end of a line: tests/test_validation.py reads and compares them).
  // A field with a default is never required.
  var JOB_DEFAULTS = {
    "priority": 0, "created_at": null, "updated_at": null, "step": 0, "job_status": null,
    "history": []
  };
  var STEP_DEFAULTS = {
    "target": "any", "alt_do": null, "timeout": null, "retry_strategy": {}, "epoch": 0,
    "claimed_by": null, "winner": null, "executioner": null, "step_status": null,
    "exec_time": null, "start_time": null, "finish_time": null, "lease_until": null,
    "attempts": 0, "exit_code": null, "output": null, "progress": null
  };
  var RETRY_DEFAULTS = {
    "max_retries": 0, "max_time": null, "sleep": null, "sleep_factor": null, "sleep_max": null
  };
  var EVENT_DEFAULTS = {"worker": null, "epoch": 0, "detail": null};

  // --- value tests -----------------------------------------------------------

  function isObject(value) {
    return typeof value === "object" && value !== null && !Array.isArray(value);
  }

  function isList(value) {
    return Array.isArray(value);
  }

  function isString(value) {
    return typeof value === "string";
  }

  function isNumber(value) {
    return typeof value === "number" && isFinite(value);
  }

  function isInteger(value) {
    return isNumber(value) && Math.floor(value) === value;
  }

  function isSiteName(value) {
    return isString(value) && SITE_NAME.test(value);
  }

  function isIsoUtc(value) {
    return isString(value) && ISO_UTC.test(value) && isCalendarDay(value);
  }

  function isCalendarDay(text) {
    // A day that exists (no February 30) in a year >= 1 (what Python's datetime can represent).
    var year = parseInt(text.slice(0, 4), 10);
    var month = parseInt(text.slice(5, 7), 10);
    var day = parseInt(text.slice(8, 10), 10);
    var leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
    return year >= 1 && day <= DAYS_IN_MONTH[month - 1] + (month === 2 && leap ? 1 : 0);
  }

  function isDocId(value) {
    // An id a daemon can put in a URL and a step's environment.
    return isString(value) && value.length >= 1 && value.length <= MAX_ID_LENGTH &&
      !CONTROL_CHARACTER.test(value) && !LONE_SURROGATE.test(value);
  }

  function has(obj, name) {
    return Object.prototype.hasOwnProperty.call(obj, name);
  }

  function nullable(test) {
    return function (value) { return value === null || test(value); };
  }

  function countUpTo(maximum) {
    return function (value) { return isInteger(value) && value >= 0 && value <= maximum; };
  }

  function oneOf(choices) {
    return function (value) { return choices.indexOf(value) !== -1; };
  }

  function describeChoices(choices) {
    return "must be one of " + choices.map(function (choice) {
      return JSON.stringify(choice);
    }).join(", ");
  }

  // --- the nearest known name (jobdist/names.py, the same rule) -------------

  function nearestName(name, known) {
    // The known name fewest edits away: at most MAX_EDITS, and fewer edits than `name`
    // has characters; the earliest in `known` on a tie.
    var nearest = null;
    var fewest = MAX_EDITS + 1;
    known.forEach(function (candidate) {
      // The distance is at least the difference in length: skip the long computation.
      if (Math.abs(candidate.length - name.length) >= fewest) {
        return;
      }
      var edits = editDistance(name, candidate);
      if (edits < fewest && edits < name.length) {
        nearest = candidate;
        fewest = edits;
      }
    });
    return nearest;
  }

  function didYouMean(name, known) {
    var nearest = nearestName(name, known);
    return nearest === null ? "" : " (did you mean '" + nearest + "'?)";
  }

  function editDistance(a, b) {
    // Optimal string alignment distance: insert, delete, replace, or swap two neighbours.
    var rows = [];
    for (var i = 0; i <= a.length; i++) {
      var row = [i];
      for (var j = 1; j <= b.length; j++) {
        if (i === 0) {
          row.push(j);
          continue;
        }
        var cost = a.charCodeAt(i - 1) === b.charCodeAt(j - 1) ? 0 : 1;
        var distance = Math.min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + cost);
        if (i > 1 && j > 1 && a.charCodeAt(i - 1) === b.charCodeAt(j - 2) &&
            a.charCodeAt(i - 2) === b.charCodeAt(j - 1)) {
          distance = Math.min(distance, rows[i - 2][j - 2] + 1);
        }
        row.push(distance);
      }
      rows.push(row);
    }
    return rows[a.length][b.length];
  }

  // --- checks: each pushes "<path>: <reason>" for what is wrong with one value

  function field(name, check, optional) {
    // `optional`: may be left out with no default (a field with one always may).
    return {name: name, check: check, optional: optional === true};
  }

  function simple(test, reason) {
    return function (value, path, errors) {
      if (!test(value)) {
        errors.push(path + ": " + reason);
      }
    };
  }

  function optionalNumber(comparison, bound) {
    var test = nullable(function (value) {
      return isNumber(value) && (comparison === ">" ? value > bound : value >= bound);
    });
    return simple(test, "must be null or a number " + comparison + " " + bound);
  }

  function text(maxLength, nonEmpty, allowNull) {
    var kind = nonEmpty ? "a non-empty string" : "a string";
    var reason = (allowNull ? "must be null or " : "must be ") + kind;
    return function (value, path, errors) {
      if (allowNull && value === null) {
        return;
      }
      if (!isString(value) || (nonEmpty && value === "")) {
        errors.push(path + ": " + reason);
      } else if (value.length > maxLength) {
        errors.push(path + ": must be at most " + maxLength + " characters long");
      }
    };
  }

  function checkFields(obj, fields, defaults, prefix, errors) {
    // Check each field in order; one with a default may be left out; an object accepts
    // no other fields.
    var known = fields.map(function (f) { return f.name; });
    fields.forEach(function (f) {
      var path = prefix + f.name;
      if (has(obj, f.name)) {
        f.check(obj[f.name], path, errors);
      } else if (!f.optional && !has(defaults, f.name)) {
        errors.push(path + ": is missing");
      }
    });
    Object.keys(obj).filter(function (name) {
      return known.indexOf(name) === -1;
    }).sort().forEach(function (name) {
      var hint = errors.length < MAX_HINTED_ERRORS ? didYouMean(name, known) : "";
      errors.push(prefix + name + ": unknown field" + hint);
    });
  }

  function objectOf(fields, reason, defaults, allowNull) {
    return function (value, path, errors) {
      if (allowNull && value === null) {
        return;
      }
      if (!isObject(value)) {
        errors.push(path + ": " + reason);
        return;
      }
      checkFields(value, fields, defaults || {}, path + ".", errors);
    };
  }

  function listOf(itemCheck) {
    return function (value, path, errors) {
      if (!isList(value)) {
        errors.push(path + ": must be a list");
        return;
      }
      value.forEach(function (item, index) {
        itemCheck(item, path + "[" + index + "]", errors);
      });
    };
  }

  function checkTarget(value, path, errors) {
    if (isSiteName(value)) {  // "any" is one too
      return;
    }
    if (!isList(value)) {
      errors.push(path + ": " + TARGET_REASON);
      return;
    }
    if (value.length === 0) {
      errors.push(path + ": must not be an empty list");
      return;
    }
    var seen = Object.create(null);
    value.forEach(function (site, index) {
      if (!isSiteName(site)) {
        errors.push(path + "[" + index + "]: " + SITE_NAME_REASON);
      } else if (seen[site]) {
        errors.push(path + "[" + index + "]: duplicate site name");
      } else {
        seen[site] = true;
      }
    });
  }

  function checkSteps(value, path, errors) {
    if (!isList(value) || value.length === 0) {
      errors.push(path + ": must be a non-empty list of steps");
      return;
    }
    if (value.length > MAX_STEPS) {
      errors.push(path + ": must have at most " + MAX_STEPS + " steps");
    }
    value.forEach(function (step, index) {
      STEP(step, path + "[" + index + "]", errors);
    });
  }

  function stepIndex(stepCount) {
    // `step` indexes `job`, or equals its length once every step is done.
    return function (value, path, errors) {
      if (!isInteger(value)) {
        errors.push(path + ": must be an integer");
      } else if (stepCount !== null && !(value >= 0 && value <= stepCount)) {
        errors.push(path + ": must be between 0 and " + stepCount + " (the number of steps)");
      }
    };
  }

  // --- the document ----------------------------------------------------------

  var SITE = simple(isSiteName, SITE_NAME_REASON);
  var OPTIONAL_SITE = simple(nullable(isSiteName), "must be null or " + SITE_NAME_RULE);
  var TIME = simple(isIsoUtc, ISO_UTC_REASON);
  var OPTIONAL_TIME = simple(nullable(isIsoUtc), "must be null or " + ISO_UTC_RULE);
  var COUNT = simple(countUpTo(MAX_COUNT), "must be an integer between 0 and " + MAX_COUNT);
  var RETRIES = simple(countUpTo(MAX_RETRIES), "must be an integer between 0 and " + MAX_RETRIES);
  var NAME = simple(isSiteName, "must be " + SITE_NAME_RULE.replace("a site name", "a name"));
  // The tick a schedule created the job for (jobdist/schedules.py).
  var TICK = objectOf([field("name", NAME), field("tick", TIME)],
                      "must be an object {name, tick}", null, false);

  var RETRY_STRATEGY_FIELDS = [
    field("max_retries", RETRIES),
    field("max_time", optionalNumber(">", 0)),
    field("sleep", optionalNumber(">=", 0)),
    field("sleep_factor", optionalNumber(">=", 1)),
    field("sleep_max", optionalNumber(">=", 0))
  ];

  var OUTPUT_FIELDS = [
    field("stdout", text(MAX_STREAM_LENGTH, false, false)),
    field("stderr", text(MAX_STREAM_LENGTH, false, false))
  ];

  var PROGRESS_FIELDS = [
    field("fraction", simple(function (value) { return isNumber(value) && value >= 0 && value <= 1; },
                             "must be a number between 0 and 1")),
    field("message", text(MAX_PROGRESS_MESSAGE, false, false)),
    field("at", TIME)
  ];

  // --- broadcast steps (docs/job-document.md, "Broadcast steps") ---
  var EACH_POLICIES = ["all", "any"];
  var RUN_STATUSES = [null, "running", "finished", "failed"];
  var MAX_RUN_SITES = 1000;
  var BROADCAST_REASON =
    'only for a broadcast step (target "all", or a list of sites with each: true)';
  // What an execution records, on its step or on its sub-run.
  var EXECUTION_FIELDS = [
    field("exec_time", optionalNumber(">=", 0)),
    field("start_time", OPTIONAL_TIME),
    field("finish_time", OPTIONAL_TIME),
    field("lease_until", OPTIONAL_TIME),
    field("attempts", COUNT),
    field("exit_code", simple(nullable(isInteger), "must be null or an integer")),
    field("output",
          objectOf(OUTPUT_FIELDS, "must be null or an object {stdout, stderr}", null, true)),
    field("progress",
          objectOf(PROGRESS_FIELDS, "must be null or an object {fraction, message, at}", null,
                   true))
  ];
  var EXECUTIONER = field("executioner", simple(nullable(isString), "must be null or a string"));
  var SUB_RUN_FIELDS = [
    field("epoch", COUNT),
    field("status", simple(oneOf(RUN_STATUSES), describeChoices(RUN_STATUSES))),
    EXECUTIONER
  ].concat(EXECUTION_FIELDS);
  var SUB_RUN = objectOf(SUB_RUN_FIELDS, "must be an object", null, false);

  function isBroadcast(step) {
    return step.target === "all" || step.each === true;
  }

  function checkRuns(value, path, errors) {
    // null until the creator opens the step; then one sub-run per site, by site name.
    if (value === null) {
      return;
    }
    if (!isObject(value)) {
      errors.push(path + ": must be null or an object of sub-runs by site name");
      return;
    }
    var sites = Object.keys(value).sort();
    if (sites.length > MAX_RUN_SITES) {
      errors.push(path + ": must have at most " + MAX_RUN_SITES + " sites");
    }
    sites.forEach(function (site) {
      if (!isSiteName(site)) {
        errors.push(path + "." + site + ": " + SITE_NAME_REASON);
      } else {
        SUB_RUN(value[site], path + "." + site, errors);
      }
    });
  }

  function checkBroadcast(step, path, errors) {
    // The broadcast fields agree with the target and with each other.
    var target = step.target;
    if (step.each === true && !isList(target) && target !== "all") {
      errors.push(path + '.each: may be true only when target is a list of sites or "all"');
    }
    if (step.each === true && isList(target) && target.length > 0 &&
        target.every(function (site) { return site === "any"; })) {
      errors.push(path + '.each: the target names no site ("any" names none): ' +
                  'list the sites, or use "all"');
    }
    var broadcast = isBroadcast(step);
    var runs = has(step, "runs") ? step.runs : null;
    ["each_policy", "runs", "dropped"].forEach(function (name) {
      if (!broadcast && has(step, name) && step[name] !== null) {
        errors.push(path + "." + name + ": " + BROADCAST_REASON);
      }
    });
    if (broadcast && step.step_status === "running" && runs === null) {
      errors.push(path + ".runs: must name the step's sites once it runs");
    }
    if (broadcast && isList(step.dropped)) {
      step.dropped.forEach(function (site, index) {
        if (isSiteName(site) && (!isObject(runs) || !has(runs, site))) {
          errors.push(path + ".dropped[" + index + "]: not one of the step's sites (runs)");
        }
      });
    }
  }

  var BROADCAST_FIELDS = [
    field("each", simple(isBoolean, "must be true or false"), true),
    field("each_policy", simple(oneOf(EACH_POLICIES), describeChoices(EACH_POLICIES)), true),
    field("runs", checkRuns, true),
    field("dropped", listOf(SITE), true)
  ];

  // Submitter fields first, then the runtime fields. Only `do` has no default.
  var STEP_FIELDS = [
    field("target", checkTarget),
    field("do", text(MAX_DO_LENGTH, true, false)),
    field("alt_do", text(MAX_DO_LENGTH, true, true)),
    field("timeout", optionalNumber(">", 0)),
    field("retry_strategy",
          objectOf(RETRY_STRATEGY_FIELDS, "must be an object", RETRY_DEFAULTS, false)),
    field("epoch", COUNT),
    field("claimed_by", OPTIONAL_SITE),
    field("winner", OPTIONAL_SITE),
    EXECUTIONER,
    field("step_status", simple(oneOf(STEP_STATUSES), describeChoices(STEP_STATUSES)))
  ].concat(EXECUTION_FIELDS);
  var STEP_OBJECT = objectOf(STEP_FIELDS.concat(BROADCAST_FIELDS), "must be an object",
                             STEP_DEFAULTS, false);

  function STEP(value, path, errors) {
    STEP_OBJECT(value, path, errors);
    if (isObject(value)) {
      checkBroadcast(value, path, errors);
    }
  }

  var EVENT_FIELDS = [
    field("event", simple(oneOf(HISTORY_EVENTS), describeChoices(HISTORY_EVENTS))),
    field("step", COUNT),
    field("site", SITE),
    field("worker", simple(nullable(isString), "must be null or a string")),
    field("epoch", COUNT),
    field("at", TIME),
    field("detail", simple(nullable(isString), "must be null or a string")),
    field("reason", simple(oneOf(EVENT_REASONS), describeChoices(EVENT_REASONS)), true)
  ];
  var EVENT = objectOf(EVENT_FIELDS, "must be an object", EVENT_DEFAULTS, false);

  function unchecked() {
    // A field that is known, and checked elsewhere or not at all.
  }

  function checkAfter(ownId) {
    // `after`: the ids of other jobs, each once, at most MAX_AFTER of them.
    return function (value, path, errors) {
      if (!isList(value) || value.length > MAX_AFTER) {
        errors.push(path + ": must be a list of at most " + MAX_AFTER + " job ids");
        return;
      }
      var seen = Object.create(null);
      value.forEach(function (item, index) {
        if (!isDocId(item)) {
          errors.push(path + "[" + index + "]: " + ID_REASON);
        } else if (item === ownId) {
          errors.push(path + "[" + index + "]: must not be the job's own id");
        } else if (seen[item]) {
          errors.push(path + "[" + index + "]: duplicate job id");
        } else {
          seen[item] = true;
        }
      });
    };
  }

  function jobFields(stepCount, ownId) {
    // Top-level fields: the job's, then the user's `meta`, then CouchDB's; no others.
    // Their order breaks ties between "did you mean" hints: the job's own come first.
    return [
      field("_id", simple(isDocId, ID_REASON), true),
      field("type", unchecked),  // checked first, by validateJob
      field("creator", SITE),
      field("priority", simple(isInteger, "must be an integer")),
      field("created_at", OPTIONAL_TIME),  // null (the default) until the creator accepts
      field("updated_at", OPTIONAL_TIME),
      field("step", stepIndex(stepCount)),
      field("job_status", simple(oneOf(JOB_STATUSES), describeChoices(JOB_STATUSES))),
      field("job", checkSteps),
      field("history", listOf(EVENT)),
      field("keepalive_at", TIME, true),
      field("meta", simple(isObject, "must be an object"), true),
      field("schedule", TICK, true),
      // Waiting (docs/job-document.md, "Waiting"): absent means none.
      field("after", checkAfter(ownId), true),
      field("after_policy", simple(oneOf(AFTER_POLICIES), describeChoices(AFTER_POLICIES)), true),
      field("not_before", OPTIONAL_TIME, true),
      field("format", simple(function (value) {
        return isInteger(value) && value >= 1 && value <= JOB_FORMAT;
      }, "must be an integer between 1 and " + JOB_FORMAT), true)
    ].concat(COUCHDB_FIELDS.map(function (name) {
      return field(name, unchecked, true);
    }));
  }

  function validateJob(doc) {
    if (!isObject(doc)) {
      return ["document: must be a JSON object"];
    }
    if (doc._deleted === true || isDesignDoc(doc)) {
      return [];
    }
    if (Object.keys(doc).every(function (name) { return name.charAt(0) === "_"; })) {
      // What a server that does not read the body as JSON stores (validation.py).
      return ["document: empty: was the body sent as JSON? (Content-Type: application/json)"];
    }
    if (doc.type !== "job") {
      return ['type: must be "job"'];
    }
    if (isInteger(doc.format) && doc.format > JOB_FORMAT) {
      return [];  // a newer release's rules, which its own sites apply: not ours to judge
    }
    var errors = [];
    // Depth first: measuring the size of a very deep document would overflow the stack.
    if (tooDeep(doc)) {
      errors.push("document: too deeply nested: more than " + MAX_DEPTH +
                  " levels of objects and lists");
    } else if (jsonSize(doc) > MAX_DOC_SIZE) {
      errors.push("document: too large: its JSON exceeds " + MAX_DOC_SIZE + " characters (1 MiB)");
    }
    var steps = doc.job;
    var stepCount = isList(steps) && steps.length > 0 ? steps.length : null;
    checkFields(doc, jobFields(stepCount, doc._id), JOB_DEFAULTS, "", errors);
    return errors;
  }

  function isDesignDoc(doc) {
    return isString(doc._id) && doc._id.indexOf("_design/") === 0;
  }

  function tooDeep(doc) {
    // Does any object or list sit more than MAX_DEPTH levels deep (the document is 1)?
    // Iterative: a deep document must not exhaust the stack.
    var pending = [];
    Object.keys(doc).forEach(function (key) {
      if (UNMEASURED_FIELDS.indexOf(key) === -1) {
        pending.push([doc[key], 2]);
      }
    });
    while (pending.length > 0) {
      var item = pending.pop();
      var value = item[0];
      if (value === null || typeof value !== "object") {
        continue;
      }
      if (item[1] > MAX_DEPTH) {
        return true;
      }
      var keys = Object.keys(value);
      for (var i = 0; i < keys.length; i++) {
        pending.push([value[keys[i]], item[1] + 1]);
      }
    }
    return false;
  }

  function jsonSize(doc) {
    var measured = Object.create(null);  // so that a "__proto__" key is copied as data
    Object.keys(doc).forEach(function (key) {
      if (UNMEASURED_FIELDS.indexOf(key) === -1) {
        measured[key] = doc[key];
      }
    });
    return JSON.stringify(measured).length;
  }

  function isBoolean(value) {
    return value === true || value === false;
  }

  // A site's status document (jobdist/status.py): `site-<name>`, written by that site.
  function validateSiteStatus(doc) {
    var errors = [];
    var flag = simple(isBoolean, "must be true or false");
    checkFields(doc, [
      field("_id", simple(function (value) {
        return isString(doc.site) && value === "site-" + doc.site;
      }, 'must be "site-" followed by the site\'s name')),
      field("type", unchecked),
      field("site", SITE),
      field("workers", COUNT),
      field("free_workers", COUNT),
      field("draining", flag),
      field("assigns", flag),
      field("restricted", flag),
      field("updated_at", TIME)
    ].concat(COUCHDB_FIELDS.map(function (name) {
      return field(name, unchecked, true);
    })), {}, "", errors);
    return errors;
  }

  // --- schedules (jobdist/schedules.py) -------------------------------------

  var CRON = /^[0-9A-Za-z*?,\/#-]+( [0-9A-Za-z*?,\/#-]+){4}$/;
  var CRON_REASON = "must be a cron expression of 5 fields (minute hour day month weekday), " +
    "e.g. \"0 2 * * *\"";
  var TIMEZONE = /^[A-Za-z][A-Za-z0-9_+-]*(\/[A-Za-z0-9_+-]+){0,2}$/;
  var TIMEZONE_REASON = 'must be an IANA time zone name, e.g. "UTC" or "Europe/Zurich"';
  var MISSED_POLICIES = ["latest", "all", "skip"];
  var SCHEDULE_DEFAULTS = {"enabled": true, "missed": "latest", "timezone": "UTC"};
  // What a tick's job takes of the template (jobdist/schedules.py tick_job): a field
  // beyond these would be dropped without a word, so it is refused.
  var TEMPLATE_FIELDS = ["type", "job", "priority", "meta"];
  var NOT_COPIED =
    "not copied to the jobs of the ticks: a schedule's job takes job, priority and meta";

  function checkTemplate(value, path, errors) {
    // The job each tick submits: a submission, with its errors under `job.`.
    if (!isObject(value)) {
      errors.push(path + ": must be an object: the job each tick submits");
      return;
    }
    var submitted = {"type": "job", "creator": "cli"};
    Object.keys(value).forEach(function (key) { submitted[key] = value[key]; });
    validateJob(submitted).forEach(function (error) { errors.push(path + "." + error); });
    jobFields(null, undefined).forEach(function (jobField) {
      if (TEMPLATE_FIELDS.indexOf(jobField.name) < 0 && has(value, jobField.name)) {
        errors.push(path + "." + jobField.name + ": " + NOT_COPIED);
      }
    });
  }

  function validateSchedule(doc) {
    var errors = [];
    var flag = simple(isBoolean, "must be true or false");
    checkFields(doc, [
      field("_id", simple(function (value) {
        return isString(doc.name) && value === "schedule-" + doc.name;
      }, 'must be "schedule-" followed by the schedule\'s name')),
      field("type", unchecked),
      field("name", NAME),
      field("cron", simple(function (value) {
        return isString(value) && value.length <= 200 && CRON.test(value);
      }, CRON_REASON)),
      field("timezone", simple(function (value) {
        return isString(value) && value.length <= 64 && TIMEZONE.test(value);
      }, TIMEZONE_REASON)),
      field("owner", SITE),
      field("enabled", flag),
      field("missed", simple(oneOf(MISSED_POLICIES), describeChoices(MISSED_POLICIES))),
      field("job", checkTemplate),
      field("created_at", TIME),
      field("updated_at", TIME)
    ].concat(COUCHDB_FIELDS.map(function (name) {
      return field(name, unchecked, true);
    })), SCHEDULE_DEFAULTS, "", errors);
    return errors;
  }

  var live = isObject(newDoc) && newDoc._deleted !== true;
  var errors;
  if (live && newDoc.type === "site") {
    errors = validateSiteStatus(newDoc);
  } else if (live && newDoc.type === "schedule") {
    errors = validateSchedule(newDoc);
  } else {
    errors = validateJob(newDoc);
  }
  if (errors.length > 0) {
    throw {forbidden: errors.join("; ")};
  }
}
