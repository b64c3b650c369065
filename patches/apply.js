// Applies patches/*.patch to node_modules: package.json's postinstall, so `npm ci` runs it.
//
// Each patch is a unified diff from the project root (`patch -p1` or `git apply` would
// apply it too); this script needs nothing but Node. A hunk is matched by its text, not its
// line numbers: it applies where its old lines occur exactly once, is skipped when its new
// lines are already there (a second run, or a tree patched before), and otherwise fails the
// install, so a pouchdb-server that no longer matches is found at `npm ci`, not at run time.
"use strict";

const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..");

// [{file, hunks: [{header, before, after}]}] of one patch's text.
function parse(text) {
  const files = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].startsWith("+++ ")) {
      files.push({ file: lines[i].slice(4).replace(/^b\//, ""), hunks: [] });
    } else if (lines[i].startsWith("@@ ")) {
      const hunk = readHunk(lines, i);
      files[files.length - 1].hunks.push(hunk);
      i = hunk.end - 1;
    }
  }
  return files;
}

function readHunk(lines, start) {
  const counts = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/.exec(lines[start]);
  let oldLeft = counts[1] === undefined ? 1 : Number(counts[1]);
  let newLeft = counts[2] === undefined ? 1 : Number(counts[2]);
  const before = [];
  const after = [];
  let i = start + 1;
  for (; oldLeft > 0 || newLeft > 0; i++) {
    const line = lines[i] === "" ? " " : lines[i]; // an editor may strip a blank context line
    const body = line.slice(1);
    if (line[0] !== "+") { before.push(body); oldLeft--; }
    if (line[0] !== "-") { after.push(body); newLeft--; }
  }
  return { header: lines[start], before: before.join("\n"), after: after.join("\n"), end: i };
}

function occurrences(text, part) {
  return text.split(part).length - 1;
}

function applyHunk(source, hunk, where) {
  if (occurrences(source, hunk.after) === 1) return source;
  if (occurrences(source, hunk.before) === 1) return source.replace(hunk.before, () => hunk.after);
  throw new Error(`${where}: hunk ${hunk.header} matches nothing (or more than once)`);
}

function applyPatch(name) {
  for (const { file, hunks } of parse(fs.readFileSync(path.join(__dirname, name), "utf8"))) {
    const target = path.join(root, file);
    const source = fs.readFileSync(target, "utf8");
    const patched = hunks.reduce((text, hunk) => applyHunk(text, hunk, `${name}: ${file}`), source);
    if (patched !== source) fs.writeFileSync(target, patched);
    console.log(`${name}: ${file} ${patched === source ? "already patched" : "patched"}`);
  }
}

try {
  fs.readdirSync(__dirname).filter((name) => name.endsWith(".patch")).sort().forEach(applyPatch);
} catch (error) {
  console.error(`jobdist patches: ${error.message}`);
  process.exit(1);
}
