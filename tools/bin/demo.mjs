#!/usr/bin/env node
// `npm run demo`: the daemon end to end, through the built CLI exactly as a user runs it. It starts the
// daemon on its own embedded PostgreSQL with the offline scripted provider, runs the example workflow
// (parallel branches and one dynamic expansion, every node turn in a forked runner) with live progress and
// its summary, delegates once from a session, shows /health, and stops the daemon.
//
// The same commands work against a real provider: set CRW_MODEL=<api>:<model id> (openai-responses,
// openai-completions, anthropic-messages or openai-codex-responses), CRW_MODEL_BASE_URL for a compatible
// server, and CRW_MODEL_API_KEY_ENV naming the variable that holds the key.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const root = resolve(import.meta.dirname, "../..");
const crw = join(root, "apps/crw/bin/crw.mjs");
const dataDir = mkdtempSync(join(tmpdir(), "crw-demo-"));
const env = { ...process.env };
delete env.DATABASE_URL;
const real = env.CRW_MODEL && env.CRW_MODEL !== "scripted";
const say = (s) => process.stdout.write(`${s}\n`);
const run = (...args) => {
  say(`\n$ crw ${args.join(" ")}`);
  const out = execFileSync(process.execPath, [crw, ...args], {
    env,
    cwd: root,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  process.stdout.write(out);
  return out;
};

try {
  run("--version");
  run("daemon", "start", "--data-dir", dataDir, "--port", "0");
  say(
    `\nThe workflow: 'plan' adds a node from inside its turn (WorkflowAddNodes), 'api' and 'docs' run in\nparallel after it, 'review' joins them. The parent session gets one summary.`,
  );
  run("workflow", "run", "examples/daemon/review.yaml", "--data-dir", dataDir);
  const session = run("session", "create", "--data-dir", dataDir).trim();
  const task = real
    ? "List three risks of running database migrations during a deploy, one line each."
    : JSON.stringify({ steps: [{ text: "Three risks: locks, long rewrites, no rollback path." }] });
  run("session", "delegate", session, task, "--data-dir", dataDir);
  run("daemon", "status", "--data-dir", dataDir);
  // crw flow: a workflow whose agent calls crw runs itself (local backend, offline scripted model)
  say("\ncrw flow: plan, two drafts in parallel, write NOTES.md, review; every answer schema-checked.");
  const flowState = join(dataDir, "flow-state");
  const flowRun = JSON.parse(
    run(
      "flow",
      "start",
      "examples/flow/release-notes.workflow.mjs",
      "--backend",
      "local",
      "--state",
      flowState,
      "--script",
      "examples/flow/release-notes.script.json",
      "--input",
      '{"version":"1.2.0"}',
      "--json",
    ),
  ).run_id;
  const flowShow = () =>
    JSON.parse(
      execFileSync(process.execPath, [crw, "flow", "show", flowRun, "--state", flowState, "--json"], {
        env,
        encoding: "utf8",
      }),
    );
  for (let i = 0; i < 600 && flowShow().status === "running"; i++)
    await new Promise((r) => setTimeout(r, 100));
  run("flow", "show", flowRun, "--state", flowState);
  say(
    [
      "",
      real
        ? `This run used ${env.CRW_MODEL}.`
        : "This run used the offline scripted provider. To point the same commands at a real provider:",
      "  CRW_MODEL=openai-completions:gpt-4o-mini CRW_MODEL_API_KEY_ENV=OPENAI_API_KEY npm run demo",
      "  CRW_MODEL=anthropic-messages:claude-sonnet-4-5 CRW_MODEL_API_KEY_ENV=ANTHROPIC_API_KEY npm run demo",
      "  (CRW_MODEL_BASE_URL=http://host:port/v1 for any compatible server)",
    ].join("\n"),
  );
} finally {
  try {
    run("daemon", "stop", "--data-dir", dataDir);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}
