#!/usr/bin/env node
// Sums the vitest JSON reports (`<project>/.reports/vitest.json`, written by tools/vitest/preset.ts) into
// the line `N passed, N failed`. A test file that failed to load counts as failed; a non-zero exit of the
// test command with no failed test recorded (a lint, typecheck or build step) counts as one failure, named.
// Usage: sum-reports.mjs [EXIT_STATUS]
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";

const root = join(import.meta.dirname, "../..");
const status = Number(process.argv[2] ?? "0");
const workspaces = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).workspaces ?? [];
const projects = workspaces.flatMap((w) =>
  w.endsWith("/*") && existsSync(join(root, w.slice(0, -2)))
    ? readdirSync(join(root, w.slice(0, -2))).map((d) => join(root, w.slice(0, -2), d))
    : [join(root, w)],
);

let passed = 0;
let failed = 0;
let skipped = 0;
const failures = [];
for (const dir of projects) {
  const file = join(dir, ".reports", "vitest.json");
  if (!existsSync(file)) continue;
  const r = JSON.parse(readFileSync(file, "utf8"));
  const loadFailures = (r.testResults ?? []).filter(
    (t) => t.status === "failed" && (t.assertionResults ?? []).every((a) => a.status !== "failed"),
  ).length;
  const f = (r.numFailedTests ?? 0) + loadFailures;
  passed += r.numPassedTests ?? 0;
  failed += f;
  skipped += (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0);
  process.stdout.write(`${relative(root, dir)}: ${r.numPassedTests ?? 0} passed, ${f} failed\n`);
  failures.push(...failuresOf(r, dir));
}
// The failures are named again here, last: a log cut to its tail still says what failed and why.
for (const line of failures) process.stdout.write(`${line}\n`);
if (status !== 0 && failed === 0) {
  process.stdout.write(
    "the test command failed outside any test (lint, typecheck or build): counted as 1 failure\n",
  );
  failed = 1;
}
process.stdout.write(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}\n`);
// A failed test fails the run even when a runner exited 0.
if (failed > 0) process.exitCode = 1;

function failuresOf(report, dir) {
  const lines = [];
  for (const file of report.testResults ?? []) {
    const where = relative(root, file.name ?? dir);
    const failedCases = (file.assertionResults ?? []).filter((a) => a.status === "failed");
    if (file.status === "failed" && failedCases.length === 0)
      lines.push(`FAILED ${where}: ${firstLine(file.message)}`);
    for (const a of failedCases)
      lines.push(`FAILED ${where} > ${a.fullName ?? a.title}: ${firstLine(a.failureMessages?.[0])}`);
  }
  return lines;
}

function firstLine(text) {
  const line =
    String(text ?? "")
      .split("\n")
      .find((l) => l.trim() !== "") ?? "";
  return line.length > 300 ? `${line.slice(0, 300)}…` : line;
}
