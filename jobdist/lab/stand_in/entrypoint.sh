#!/bin/sh
# pouchdb-server as the couchdb:3 image runs: its admin from COUCHDB_USER and
# COUCHDB_PASSWORD (written to the config file once; the server hashes it at start),
# its data in /opt/couchdb/data, on port 5984. Warnings and errors only, as the lab's
# local servers (jobdist.lab.localserver): a log line a request costs a tenth of its CPU.
set -e
node -e '
const fs = require("fs");
const path = "/opt/couchdb/data/config.json";
let config = {};
try { config = JSON.parse(fs.readFileSync(path)); } catch (e) {}
config.log = Object.assign({level: "warning"}, config.log);
config.pouchdb_server = Object.assign({}, config.pouchdb_server, {"no-stdout-logs": true});
const user = process.env.COUCHDB_USER, password = process.env.COUCHDB_PASSWORD;
if (user && password) {
  config.admins = config.admins || {};
  if (!(user in config.admins)) config.admins[user] = password;
}
fs.writeFileSync(path, JSON.stringify(config), {mode: 0o600});
'
# Node 15+ would end the server on one unhandled rejection (see localserver.node_command).
exec node --unhandled-rejections=warn /opt/pouchdb-server/node_modules/pouchdb-server/bin/pouchdb-server \
    --host 0.0.0.0 --port 5984 --dir /opt/couchdb/data --config /opt/couchdb/data/config.json
