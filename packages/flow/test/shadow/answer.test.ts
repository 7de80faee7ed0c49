import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { lockHolder, tryLock } from "../../src/run/locks.js";
import { pidAlive } from "../../src/util/liveness.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";

/** A local run that asks one decision between two calls-free steps; no account, no host. */
const workflowSource = `
export default {
  name: "decide",
  async run(ctx) {
    const ship = await ctx.decide({ id: "ship", question: "Ship it?", options: ["yes", "no"] });
    return { ship };
  },
};
`;

beforeAll(() => ensureBuilt(), 180_000);
/** Each paused run's directory, removed once the file's tests are done (its run process has ended). */
const roots: string[] = [];
afterAll(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

interface Run {
  state: string;
  runTmp: string;
  dir: string;
  rows(): JournalRow[];
  journal(): string;
  env: NodeJS.ProcessEnv;
}

async function pausedRun(name: string): Promise<Run> {
  const root = mkdtempSync(join(tmpdir(), "crw-flow-answer-"));
  roots.push(root);
  const state = join(root, "state");
  const runTmp = join(root, "run-tmp");
  mkdirSync(runTmp);
  const workflow = join(root, "decide.mjs");
  writeFileSync(workflow, workflowSource);
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  const start = await crwFlow(
    ["start", workflow, "--state", state, "--run", name, "--json"],
    { ...env, TMPDIR: runTmp },
    root,
  );
  expect(start.code, start.stderr).toBe(0);
  const dir = join(state, "flow", name);
  const run: Run = {
    state,
    runTmp,
    dir,
    rows: () => readJournalFile(join(dir, "journal.jsonl")).rows,
    journal: () => readFileSync(join(dir, "journal.jsonl"), "utf8"),
    env,
  };
  await waitFor(
    "the run to pause waiting_decision",
    () => existsSync(join(dir, "journal.jsonl")) && run.rows().some((r) => r.type === "run_paused"),
    30_000,
  );
  expect(run.rows().find((r) => r.type === "run_paused")).toMatchObject({ reason: "waiting_decision:ship" });
  await waitFor(
    "the paused run's process to let the run go",
    () => lockHolder(join(dir, "run.lock")) === null,
    30_000,
  );
  expect(run.rows().find((r) => r.type === "decision_requested")).toMatchObject({
    decision: "ship",
    question: "Ship it?",
    options: ["yes", "no"],
  });
  return run;
}

const startedCount = (run: Run) => run.rows().filter((r) => r.type === "started").length;

async function ended(run: Run): Promise<JournalRow> {
  return waitFor("the run to end", () => run.rows().find((r) => r.type === "run_ended"), 30_000);
}

describe("crw flow answer", () => {
  it("answers a decision once and resumes the run once; a second answer and an answer not in the options are refused", async () => {
    const run = await pausedRun("once");
    const next = await crwFlow(["next", "once", "--state", run.state, "--json"], run.env);
    expect(next.code, next.stderr).toBe(0);
    const answer = JSON.parse(next.stdout) as { state: string; paused?: { reason: string }; hint: string };
    expect(answer.state).toBe("waiting_decision");
    expect(answer.paused?.reason).toBe("waiting_decision:ship");
    expect(answer.hint).toContain("flow answer once");
    expect(startedCount(run)).toBe(1);
    const notAnOption = await crwFlow(
      ["answer", "once", "ship", "maybe", "--state", run.state, "--json"],
      run.env,
    );
    expect(notAnOption.code).toBe(2);
    const r = await crwFlow(["answer", "once", "ship", "yes", "--state", run.state, "--json"], run.env);
    expect(r.code, r.stderr).toBe(0);
    expect(await ended(run)).toMatchObject({ status: "completed", result: { ship: "yes" } });
    const journal = run.journal();
    const again = await crwFlow(["answer", "once", "ship", "no", "--state", run.state, "--json"], run.env);
    expect(again.code).toBe(1);
    expect(run.journal()).toBe(journal);
    expect(run.rows().filter((x) => x.type === "decision_answered")).toHaveLength(1);
    expect(startedCount(run)).toBe(2);
  }, 60_000);

  it("with the recorded TMPDIR gone the answer refuses run_env_unusable (nothing appended, no process); once made again it applies once and resumes once (S000-242 S000-243)", async () => {
    const run = await pausedRun("env");
    rmSync(run.runTmp, { recursive: true });
    const journal = run.journal();
    const log = readFileSync(join(run.dir, "process.log"), "utf8");
    // a process still holds the run: a refusal drains nothing, it comes at once and leaves the lock
    const holder = spawn(process.execPath, ["-e", "setTimeout(() => {}, 20000)"], { stdio: "ignore" });
    expect(tryLock(join(run.dir, "run.lock"), { pid: holder.pid as number })).toBe(true);
    let refused: Awaited<ReturnType<typeof crwFlow>>;
    try {
      // a drain first would wait out --wait 10 and refuse run_live (below: run_env_unusable)
      refused = await crwFlow(
        ["answer", "env", "ship", "yes", "--wait", "10", "--state", run.state, "--json"],
        run.env,
      );
      expect(lockHolder(join(run.dir, "run.lock"))?.pid).toBe(holder.pid);
    } finally {
      holder.kill("SIGKILL");
    }
    expect(refused.code).toBe(1);
    expect(refused.json()).toMatchObject({ error: { code: "run_env_unusable" } });
    expect(refused.stderr).toContain(run.runTmp);
    // a process started would have written to the run's process.log, even one that refuses at once
    await new Promise((r) => setTimeout(r, 500));
    expect(run.journal()).toBe(journal);
    expect(readFileSync(join(run.dir, "process.log"), "utf8")).toBe(log);
    mkdirSync(run.runTmp);
    const ok = await crwFlow(["answer", "env", "ship", "no", "--state", run.state, "--json"], run.env);
    expect(ok.code, ok.stderr).toBe(0);
    expect(await ended(run)).toMatchObject({ status: "completed", result: { ship: "no" } });
    expect(run.rows().filter((x) => x.type === "decision_answered")).toHaveLength(1);
    expect(startedCount(run)).toBe(2);
  }, 60_000);

  it("--no-resume starts nothing and does not check the TMPDIR; the later relaunch refuses (S000-244)", async () => {
    const run = await pausedRun("nores");
    rmSync(run.runTmp, { recursive: true });
    const log = readFileSync(join(run.dir, "process.log"), "utf8");
    const r = await crwFlow(
      ["answer", "nores", "ship", "yes", "--no-resume", "--state", run.state, "--json"],
      run.env,
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({ resumed_pid: null });
    expect(run.rows().filter((x) => x.type === "decision_answered")).toHaveLength(1);
    await new Promise((res) => setTimeout(res, 500));
    expect(startedCount(run)).toBe(1);
    // no process was started (one would have written to process.log, refusing or not)
    expect(readFileSync(join(run.dir, "process.log"), "utf8")).toBe(log);
    const relaunch = await crwFlow(["resume", "nores", "--detach", "--state", run.state], run.env);
    expect(relaunch.code).toBe(1);
    expect(relaunch.stderr).toContain(run.runTmp);
    expect(startedCount(run)).toBe(1);
  }, 60_000);

  it("the answer still holds the run lock when its row is stored: killed right after that row, the lock it took after the drained process is its own (S000-217)", async () => {
    const run = await pausedRun("held");
    const holder = spawn(process.execPath, ["-e", "setTimeout(() => {}, 1000)"], { stdio: "ignore" });
    expect(tryLock(join(run.dir, "run.lock"), { pid: holder.pid as number })).toBe(true);
    const r = await crwFlow(
      ["answer", "held", "ship", "yes", "--wait", "20", "--state", run.state, "--json"],
      { ...run.env, CRW_FLOW_FAULT: "after:decision_answered:1" },
    );
    expect(r.code).not.toBe(0); // SIGKILLed at its fault point
    expect(run.rows().at(-1)).toMatchObject({ type: "decision_answered", answer: "yes" });
    const lock = JSON.parse(readFileSync(join(run.dir, "run.lock"), "utf8")) as { pid: number };
    expect(lock.pid).not.toBe(holder.pid);
    expect(lock.pid).not.toBe(process.pid);
    expect(pidAlive(lock.pid)).toBe(false); // the answer's own, dead with it
    expect(startedCount(run)).toBe(1); // nothing resumed before the row and the lock were settled
  }, 60_000);

  it("the answer waits for the process holding the run to end, holds the lock until its row is stored, and the resume takes the lock after (S000-217)", async () => {
    // the second run (a holder that never lets go, below) pauses while the first one is answered
    const paused2 = pausedRun("stuck");
    paused2.catch(() => {}); // awaited below, where a failure is reported
    const run = await pausedRun("drain");
    // a process still holds the run (as the one that paused it would, for a moment)
    const holder = spawn(process.execPath, ["-e", "setTimeout(() => {}, 1500)"], { stdio: "ignore" });
    const pid = holder.pid as number;
    expect(tryLock(join(run.dir, "run.lock"), { pid })).toBe(true);
    let holderEnded = 0;
    holder.on("exit", () => {
      holderEnded = Date.now();
    });
    const r = await crwFlow(
      ["answer", "drain", "ship", "yes", "--wait", "20", "--state", run.state, "--json"],
      run.env,
    );
    expect(r.code, r.stderr).toBe(0);
    expect(holderEnded).toBeGreaterThan(0);
    const answered = run.rows().find((x) => x.type === "decision_answered");
    if (answered?.type !== "decision_answered") throw new Error("no decision_answered");
    expect(Date.parse(answered.at)).toBeGreaterThanOrEqual(holderEnded - 50);
    expect(await ended(run)).toMatchObject({ status: "completed", result: { ship: "yes" } });
    const resumed = run.rows().filter((x) => x.type === "started")[1];
    expect(resumed?.seq ?? -1).toBeGreaterThan(answered.seq);
    // a holder that never lets go: the answer gives up after --wait, appending nothing
    const run2 = await paused2;
    const stuck = spawn(process.execPath, ["-e", "setTimeout(() => {}, 20000)"], { stdio: "ignore" });
    expect(tryLock(join(run2.dir, "run.lock"), { pid: stuck.pid as number })).toBe(true);
    const journal = run2.journal();
    const late = await crwFlow(
      ["answer", "stuck", "ship", "yes", "--wait", "1", "--state", run2.state, "--json"],
      run2.env,
    );
    stuck.kill();
    expect(late.code).toBe(1);
    expect(late.json()).toMatchObject({ error: { code: "run_live" } });
    expect(run2.journal()).toBe(journal);
  }, 90_000);
});
