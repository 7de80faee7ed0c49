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
import { lstatSync, mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const root = resolve(import.meta.dirname, "../..");
const crw = join(root, "apps/crw/bin/crw.mjs");
const dataDir = mkdtempSync(join(tmpdir(), "crw-demo-"));
const sampleDir = mkdtempSync(join(tmpdir(), "crw-demo-sample-"));
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

const git = (cwd, ...args) => execFileSync("git", args, { cwd, encoding: "utf8" });

/** A sample repository whose test fails: `add` subtracts. */
function sampleRepository(dir) {
  mkdirSync(dir, { recursive: true });
  git(dir, "init", "-q", "-b", "main");
  writeFileSync(join(dir, "calc.js"), "export const add = (a, b) => a - b;\n");
  writeFileSync(
    join(dir, "test.js"),
    'import { add } from "./calc.js";\nif (add(2, 3) !== 5) { console.log("FAIL: add(2, 3) is", add(2, 3)); process.exit(1); }\nconsole.log("PASS");\n',
  );
  writeFileSync(join(dir, "package.json"), '{ "type": "module" }\n');
  git(dir, "add", ".");
  git(
    dir,
    "-c",
    "user.name=demo",
    "-c",
    "user.email=demo@localhost",
    "commit",
    "-q",
    "-m",
    "sample: add is broken",
  );
  return dir;
}

const script = (steps) => JSON.stringify({ steps });
const FIX = real
  ? "calc.js has a bug: add subtracts. Read it, fix it with the edit tool, run `node test.js`, and report what it printed."
  : script([
      { toolCalls: [{ name: "read", arguments: { path: "calc.js" } }] },
      { toolCalls: [{ name: "edit", arguments: { path: "calc.js", oldText: "a - b", newText: "a + b" } }] },
      { toolCalls: [{ name: "shell", arguments: { command: "node test.js" } }] },
      { text: "Fixed add in calc.js (it subtracted) and ran node test.js." },
    ]);
const writeNode = (path, content) =>
  real
    ? `Write ${path} with one line saying what changed in calc.js.`
    : script([{ toolCalls: [{ name: "write", arguments: { path, content } }] }, { text: `Wrote ${path}.` }]);
const CHECK = real
  ? "Run `cat NOTES.md CHANGELOG.md && node test.js` and report what it printed."
  : script([
      { toolCalls: [{ name: "shell", arguments: { command: "cat NOTES.md CHANGELOG.md && node test.js" } }] },
      { text: "Both files are there and the test passes." },
    ]);

/** Agents that change code: a child in a runner fixes a bug on its own branch, crw lands it, a workflow writes files. */
function codeWork() {
  // Beside the data directory, never inside it: the daemon's own files are no agent's working directory.
  const sample = sampleRepository(join(sampleDir, "sample"));
  say(`\nAgents at work in a sample repository (${sample}): 'node test.js' fails there, add subtracts.`);
  const session = run("session", "create", "--cwd", sample, "--data-dir", dataDir).trim();
  say("\nAn isolated child (in a runner, on a git worktree and branch of its own) reads, edits and tests:");
  // --json prints progress notifications as JSON lines, then the result as the last one.
  const lines = run(
    "session",
    "delegate",
    session,
    FIX,
    "--isolation",
    "worktree",
    "--json",
    "--data-dir",
    dataDir,
  )
    .trim()
    .split("\n");
  const fixed = JSON.parse(lines.at(-1));
  run("session", "land", fixed.childSessionId, "--data-dir", dataDir);
  say(
    "\nA workflow in the same repository, every node on a branch of its own: two parallel nodes write a file\neach, a third starts from the merge of their branches and reads both; then the workflow lands.",
  );
  const flow = join(dataDir, "sample-notes.yaml");
  writeFileSync(
    flow,
    JSON.stringify({
      name: "notes-for-the-fix",
      nodes: [
        { id: "notes", task: writeNode("NOTES.md", "add adds again.\n"), isolation: "worktree" },
        {
          id: "changelog",
          task: writeNode("CHANGELOG.md", "- fix: add(2, 3) is 5\n"),
          isolation: "worktree",
        },
        { id: "check", task: CHECK, dependsOn: ["notes", "changelog"], isolation: "worktree" },
      ],
    }),
  );
  const before = git(sample, "rev-parse", "HEAD").trim();
  const started = run("workflow", "run", flow, "--cwd", sample, "--data-dir", dataDir);
  const workflowId = /^workflow ([0-9a-f-]{36}) started/m.exec(started)?.[1];
  run("workflow", "land", workflowId, "--data-dir", dataDir);
  say(
    `\n$ git log --oneline --graph (in the sample)\n${git(sample, "log", "--oneline", "--graph").trimEnd()}`,
  );
  say(
    `\n$ git diff --stat ${before.slice(0, 7)} HEAD\n${git(sample, "diff", "--stat", before, "HEAD").trimEnd()}`,
  );
  const first = git(sample, "rev-list", "--max-parents=0", "HEAD").trim();
  say(
    `\n$ git diff ${first.slice(0, 7)} HEAD -- calc.js\n${git(sample, "diff", first, "HEAD", "--", "calc.js").trimEnd()}`,
  );
  say(`\n$ git status --short\n${git(sample, "status", "--short").trimEnd() || "(clean)"}`);
  say(
    `\n$ node test.js\n${execFileSync(process.execPath, ["test.js"], { cwd: sample, encoding: "utf8" }).trimEnd()}`,
  );
}

/**
 * crw flow: a workflow whose agent calls crw runs itself (local backend). In a sample repository of its
 * own: the run's branch carries the executor's NOTES.md to the reviewer, and `crw flow land` brings it
 * onto the sample's main.
 */
async function flowWork() {
  const notes = join(sampleDir, "notes");
  mkdirSync(notes, { recursive: true });
  git(notes, "init", "-q", "-b", "main");
  writeFileSync(join(notes, "README.md"), "# release notes sample\n");
  git(notes, "add", ".");
  git(notes, "-c", "user.name=demo", "-c", "user.email=demo@localhost", "commit", "-q", "-m", "sample");
  say(
    `\ncrw flow in ${notes}: plan, two drafts in parallel, write NOTES.md on the run's branch, review it; every answer schema-checked.`,
  );
  const flowState = join(dataDir, "flow-state");
  const model = real ? ["--model", env.CRW_MODEL] : ["--script", "examples/flow/release-notes.script.json"];
  const flowRun = JSON.parse(
    run(
      "flow",
      "start",
      "examples/flow/release-notes.workflow.mjs",
      "--backend",
      "local",
      "--repo",
      notes,
      "--state",
      flowState,
      ...model,
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
  for (let i = 0; i < 600 && ["running", "starting"].includes(flowShow().status); i++)
    await new Promise((r) => setTimeout(r, 100));
  run("flow", "show", flowRun, "--state", flowState);
  const before = git(notes, "rev-parse", "HEAD").trim();
  run("flow", "land", flowRun, "--state", flowState);
  say(
    `\n$ git diff ${before.slice(0, 7)} HEAD (in the sample)\n${git(notes, "diff", before, "HEAD").trimEnd()}`,
  );
}

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
  codeWork();
  run("daemon", "status", "--data-dir", dataDir);
  await flowWork();
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
    removeDataDir(dataDir);
    rmSync(sampleDir, { recursive: true, force: true });
  }
}

/**
 * The demo's data directory, with its database: under root the daemon's cluster lives under the server
 * user's home and `postgres` here is a link to it, which removing the directory alone would leave behind.
 */
function removeDataDir(dir) {
  const link = join(dir, "postgres");
  try {
    if (lstatSync(link).isSymbolicLink()) rmSync(realpathSync(link), { recursive: true, force: true });
  } catch {
    // no cluster was made, or it is gone already
  }
  rmSync(dir, { recursive: true, force: true });
}
