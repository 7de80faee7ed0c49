import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  cancelRequestPath,
  type JournalRow,
  listStepFiles,
  lockHolder,
  pidAlive,
  readJournalFile,
  runPaths,
} from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { startModelServer } from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempRepo } from "./git/repo.js";
import { crwFlow, dispatchedArgs, ownerSession, plainEnv, waitFor } from "./helpers/cli.js";
import { commandsRunning } from "./helpers/procs.js";

/** `crw flow cancel` as a user runs it, against runs in their own processes. */

const schema = `{ type: "object", required: ["n"], properties: { n: { type: "integer" } } }`;
const oneCall = `export default { name: "one", run: (ctx) => ctx.call({ role: "explorer", task: "count", schema: ${schema} }) };\n`;
const decision = `export default { name: "decide", async run(ctx) { return { ship: await ctx.decide({ id: "ship", question: "Ship it?" }) }; } };\n`;
const noCalls = `export default { name: "none", async run() { return { ok: true }; } };\n`;

let fake: FakeAppServer;
let root: string;
let env: NodeJS.ProcessEnv;
/** A plain terminal's environment: no owner thread, no fault point, no provider settings. */
let plain: NodeJS.ProcessEnv;

beforeAll(async () => {
  ({ fake, root, env } = await ownerSession("crw-flow-cancel-"));
  plain = plainEnv({}, env);
}, 120_000);

afterAll(async () => {
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

function workflowFile(name: string, source: string): string {
  const path = join(root, `${name}.mjs`);
  writeFileSync(path, source);
  return path;
}

const rowsOf = (state: string, run: string): JournalRow[] =>
  readJournalFile(runPaths(state, run).journal).rows;

function waitRow(state: string, run: string, check: (r: JournalRow) => boolean, what: string) {
  return waitFor(
    what,
    () => existsSync(runPaths(state, run).journal) && rowsOf(state, run).find(check),
    30_000,
  );
}

describe("a session run whose process dies right after it journaled the cancel", () => {
  const run = "run-cancel-crash";
  let state: string;
  let agent: { threadId: string; turnId: string };
  let firstCancel: { code: number; json: Record<string, unknown> };
  let deadPid: number;
  let rowsAtDeath: JournalRow[];
  let turnAtDeath: string;
  let resume: { code: number; stderr: string };
  let rows: JournalRow[];

  beforeAll(async () => {
    state = join(root, "state-crash");
    const start = await crwFlow(
      ["start", workflowFile(run, oneCall), "--run", run, "--state", state, "--poll-ms", "20", "--json"],
      { ...env, CRW_FLOW_FAULT: "after:cancel_requested:1" },
      root,
    );
    expect(start.code, start.stderr).toBe(0);
    deadPid = Number(start.json().pid);
    const paths = runPaths(state, run);
    const step = await waitFor("the explorer's step", () => listStepFiles(paths.steps).steps[0], 30_000);
    agent = fake.spawnSubagent({
      ownerThreadId: String(env.CODEX_THREAD_ID),
      message: step.message,
      agentRole: "explorer",
    });
    const d = await crwFlow(dispatchedArgs(run, step, agent.threadId, state, ["--wait", "20"]), env, root);
    expect(d.json()).toMatchObject({ reply: "bound" });
    await waitRow(state, run, (r) => r.type === "turn_started", "the explorer's turn bound");
    const c = await crwFlow(
      ["cancel", run, "--state", state, "--reason", "not needed", "--wait", "3", "--json"],
      env,
      root,
    );
    firstCancel = { code: c.code, json: c.json() };
    await waitFor("the killed process gone", () => !pidAlive(deadPid), 10_000);
    rowsAtDeath = rowsOf(state, run);
    turnAtDeath = fake.state.turn(agent.threadId, agent.turnId).status;
    // only the journal's row can carry the request on from here
    rmSync(cancelRequestPath(paths));
    const r = await crwFlow(["resume", run, "--state", state], plain, root);
    resume = { code: r.code, stderr: r.stderr };
    rows = rowsOf(state, run);
  }, 120_000);

  it("the command that asked says the run is still cancelling when its process died first", () => {
    expect(firstCancel.code).toBe(1);
    expect(firstCancel.json).toMatchObject({ run_id: run, state: "cancelling", reason: "not needed" });
    expect(rowsAtDeath.at(-1)).toMatchObject({ type: "cancel_requested", reason: "not needed" });
    expect(rowsAtDeath.some((r) => r.type === "run_ended" || r.type === "interrupt_requested")).toBe(false);
    expect(turnAtDeath).toBe("inProgress");
  });

  it("the next process finds the journaled request, interrupts the turn the dead one left running and ends the run cancelled (S000-102)", () => {
    expect(resume.code, resume.stderr).toBe(0);
    expect(rows.filter((r) => r.type === "cancel_requested")).toHaveLength(1);
    const interrupt = rows.find((r) => r.type === "interrupt_requested");
    expect(interrupt).toMatchObject({ call: "explorer.1", reason: "cancelled", turn_id: agent.turnId });
    expect(fake.state.turn(agent.threadId, agent.turnId).status).toBe("interrupted");
    const held = rows.find((r) => r.type === "held");
    expect(held).toMatchObject({ call: "explorer.1", reason: "cancelled" });
    expect((held?.seq ?? 0) > (interrupt?.seq ?? 0)).toBe(true);
    expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "cancelled", reason: "not needed" });
    // the process let the run go, and the request is spent
    expect(lockHolder(runPaths(state, run).runLock)).toBeNull();
  });

  it("next answers the ended run with a close step for the subagent it left, and a second cancel is a no-op", async () => {
    const next = await crwFlow(["next", run, "--state", state, "--json"], env, root);
    const answer = next.json();
    expect(answer).toMatchObject({ state: "ended" });
    expect(JSON.stringify(answer.steps)).toContain(agent.threadId);
    const before = readFileSync(runPaths(state, run).journal, "utf8");
    const again = await crwFlow(["cancel", run, "--state", state, "--json"], env, root);
    expect(again.code).toBe(0);
    expect(again.json()).toMatchObject({ state: "ended", status: "cancelled", reason: "not needed" });
    expect(readFileSync(runPaths(state, run).journal, "utf8")).toBe(before);
  });
});

describe("runs no process holds, and runs that ended", () => {
  it("a paused run gets a process that ends it cancelled without running the workflow on", async () => {
    const state = join(root, "state-paused");
    const run = "run-decide";
    const start = await crwFlow(
      ["start", workflowFile(run, decision), "--run", run, "--state", state, "--json"],
      plain,
      root,
    );
    expect(start.code, start.stderr).toBe(0);
    await waitRow(state, run, (r) => r.type === "run_paused", "the run to wait for its decision");
    await waitFor("the paused run let go", () => lockHolder(runPaths(state, run).runLock) === null, 30_000);
    const c = await crwFlow(["cancel", run, "--state", state, "--json"], plain, root);
    expect(c.code, c.stderr).toBe(0);
    expect(c.json()).toMatchObject({
      run_id: run,
      state: "ended",
      status: "cancelled",
      reason: "cancelled with crw flow cancel",
      resumed_pid: expect.any(Number),
    });
    const rows = rowsOf(state, run);
    expect(rows.filter((r) => r.type === "started")).toHaveLength(2);
    expect(rows.slice(-2).map((r) => r.type)).toEqual(["cancel_requested", "run_ended"]);
    expect(rows.filter((r) => r.type === "cancel_requested")).toHaveLength(1);
    // once its process let the run go, the request is spent
    await waitFor("the process let go", () => lockHolder(runPaths(state, run).runLock) === null, 10_000);
    expect(existsSync(cancelRequestPath(runPaths(state, run)))).toBe(false);
    const answer = await crwFlow(["answer", run, "ship", "yes", "--state", state], plain, root);
    expect(answer.code).not.toBe(0);
    expect(rowsOf(state, run).some((r) => r.type === "decision_answered")).toBe(false);
  }, 60_000);

  it("a completed run is not cancelled: exit 1, and nothing is written", async () => {
    const state = join(root, "state-done");
    const run = "run-done";
    const start = await crwFlow(
      ["start", workflowFile(run, noCalls), "--run", run, "--state", state, "--json"],
      plain,
      root,
    );
    expect(start.code, start.stderr).toBe(0);
    await waitRow(state, run, (r) => r.type === "run_ended", "the run to complete");
    const paths = runPaths(state, run);
    const before = readFileSync(paths.journal, "utf8");
    const c = await crwFlow(["cancel", run, "--state", state, "--json"], plain, root);
    expect(c.code).toBe(1);
    expect(c.json()).toMatchObject({ state: "ended", status: "completed" });
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
    expect(existsSync(cancelRequestPath(paths))).toBe(false);
  });

  it("a reason that is empty or too long is an input error (exit 2), before anything is asked", async () => {
    const state = join(root, "state-done");
    for (const reason of ["", " ", "x".repeat(1001)]) {
      const c = await crwFlow(["cancel", "run-done", "--state", state, "--reason", reason], plain, root);
      expect(c.code).toBe(2);
      expect(c.stderr).toContain("--reason");
    }
    const missing = await crwFlow(["cancel", "no-such-run", "--state", state, "--json"], plain, root);
    expect(missing.code).toBe(2);
    expect(missing.json()).toMatchObject({ error: { code: "run_not_found" } });
  });
});

describe("a local run whose subagent runs a long command when the run is cancelled", () => {
  it("the turn is aborted with its command, the call held and the run ended cancelled, without waiting for the command", async () => {
    const marker = `sleep ${(300 + Math.random()).toFixed(3)}`;
    let released: (() => void) | null = null;
    const server = await startModelServer(async (q) => {
      if (q.toolResults.length === 0) return { tool: { name: "shell", arguments: { command: marker } } };
      // a later request (there should be none) waits until the test ends
      await new Promise<void>((ok) => {
        released = ok;
      });
      return { text: '{"n":1}' };
    });
    const repo = tempRepo("crw-flow-cancel-local-").repo;
    const state = mkdtempSync(join(root, "state-local-"));
    const run = "run-local";
    try {
      const start = await crwFlow(
        [
          "start",
          workflowFile(run, oneCall),
          "--backend",
          "local",
          "--model",
          "openai-completions:cancel-probe",
          "--model-base-url",
          server.openaiBaseUrl,
          "--model-api-key-env",
          "CANCEL_TEST_KEY",
          "--run",
          run,
          "--state",
          state,
          "--repo",
          repo,
          "--json",
        ],
        { ...plain, CANCEL_TEST_KEY: "sk-cancel" },
        root,
      );
      expect(start.code, start.stderr).toBe(0);
      await waitFor("the command running", () => commandsRunning(marker) > 0, 30_000);
      const t0 = performance.now();
      const c = await crwFlow(["cancel", run, "--state", state, "--json"], plain, root);
      expect(c.code, c.stderr).toBe(0);
      expect(c.json()).toMatchObject({ state: "ended", status: "cancelled" });
      expect(performance.now() - t0).toBeLessThan(20_000);
      const rows = rowsOf(state, run);
      expect(rows.find((r) => r.type === "held")).toMatchObject({ call: "explorer.1", reason: "cancelled" });
      expect(rows.some((r) => r.type === "completed" || r.type === "null_model")).toBe(false);
      expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "cancelled" });
      await waitFor("the command gone", () => commandsRunning(marker) === 0, 10_000);
      expect(server.requests).toHaveLength(1);
    } finally {
      (released as (() => void) | null)?.();
      await server.close();
      rmSync(repo, { recursive: true, force: true });
    }
  }, 60_000);
});
