import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FlowError, type FlowRunOutcome, type JournalRow, readJournalFile, runPaths } from "@crw/flow";
import { startModelServer } from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { normalizeCall } from "../src/engine/workflow.js";
import { tempRepo } from "./git/repo.js";
import { crwFlow, ensureBuilt, plainEnv, waitFor } from "./helpers/cli.js";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType,
  countSchema as schema,
} from "./helpers/harness.js";
import { commandsRunning } from "./helpers/procs.js";

/** Long enough for the test to bind the subagent on a loaded machine before the deadline. */
const DEADLINE_MS = 2500;

/**
 * The explorer's call has a deadline; its subagent is bound and its turn never ends by itself. The
 * reviewer's step (no deadline) waits for the owner meanwhile. The host ends an interrupted turn 300 ms
 * after it answered the interrupt. Then a resume gives the explorer a new attempt, answered in time.
 */
describe("a call that runs past its deadline", () => {
  let r: InProcessRun;
  let rows: JournalRow[];
  let outcome: FlowRunOutcome;
  let first: { threadId: string; turnId: string };
  let resumed: FlowRunOutcome;
  let resumedRows: JournalRow[];
  const wf = defineWorkflow({
    name: "deadline",
    run: (ctx) =>
      Promise.all([
        ctx.call({ role: "explorer", task: "a", schema, deadlineMs: DEADLINE_MS }),
        ctx.call({ role: "reviewer", task: "b", schema }),
      ]),
  });

  beforeAll(async () => {
    r = await inProcessRun();
    r.fake.setInterruptDelay(300);
    const { done } = r.background(wf);
    const steps = await r.steps(2);
    const ex = steps.find((s) => s.call === "explorer.1");
    if (!ex) throw new Error("no explorer step");
    first = r.spawn(ex, "explorer");
    expect(await r.report(ex, first.threadId)).toBe("bound");
    outcome = await done;
    rows = r.rows();
    // the resume: attempt 2 of the explorer, and the reviewer's step again
    const again = r.background(wf);
    const next = await r.steps(2);
    for (const s of next) {
      const role = s.call === "explorer.1" ? "explorer" : "reviewer";
      const a = r.spawn(s, role);
      expect(await r.report(s, a.threadId)).toBe("bound");
      r.fake.answer(a.threadId, '{"n":1}');
    }
    resumed = await again.done;
    resumedRows = r.rows();
  }, 30_000);
  afterAll(() => r?.close());

  const at = (row: JournalRow | undefined) => Date.parse(row?.at as string);
  const explorerRows = () => rows.filter((x) => "call" in x && x.call === "explorer.1");

  it("a deadline interrupts the bound subagent's running turn, and the call is held for it once the thread reads inactive (S000-102)", () => {
    const step = explorerRows().find((x) => x.type === "step_published");
    const interrupt = rowsOfType(rows, "interrupt_requested")[0];
    expect(interrupt).toMatchObject({ call: "explorer.1", reason: "deadline", turn_id: first.turnId });
    expect(at(interrupt) - at(step)).toBeGreaterThanOrEqual(DEADLINE_MS);
    expect(r.fake.state.turn(first.threadId, first.turnId).status).toBe("interrupted");
    const ended = r.fake.interruptsEnded.find((e) => e.turnId === first.turnId);
    const held = explorerRows().find((x) => x.type === "held");
    expect(held).toMatchObject({ reason: "deadline" });
    expect(at(held)).toBeGreaterThanOrEqual((ended?.at ?? Number.POSITIVE_INFINITY) - 5);
  });

  it("the run pauses for the held call, and its other calls stop with it", () => {
    expect(outcome).toEqual({ state: "paused", reason: "held:explorer.1" });
    expect(rowsOfType(rows, "run_paused")).toEqual([
      expect.objectContaining({ reason: "held:explorer.1", call: "explorer.1" }),
    ]);
    expect(rows.find((x) => x.type === "held" && x.call === "reviewer.1")).toMatchObject({
      reason: "held:explorer.1",
    });
  });

  it("a resume gives the call a new attempt with a whole deadline of its own", () => {
    expect(resumed.state).toBe("completed");
    const done = resumedRows.find((x) => x.type === "completed" && x.call === "explorer.1");
    expect(done).toMatchObject({ attempt: 2 });
    expect(resumedRows.filter((x) => x.type === "interrupt_requested")).toHaveLength(1);
  });
});

describe("a deadline as the workflow gives it", () => {
  it("is part of the call's recorded input, and a value that is no whole number of ms up to seven days is refused", () => {
    expect(normalizeCall({ role: "explorer", task: "t", deadlineMs: 5000 }).deadlineMs).toBe(5000);
    expect(normalizeCall({ role: "explorer", task: "t" }).deadlineMs).toBeNull();
    for (const bad of [0, -1, 1.5, Number.NaN, 7 * 24 * 3600 * 1000 + 1, "5000"]) {
      expect(() => normalizeCall({ role: "explorer", task: "t", deadlineMs: bad as number })).toThrow(
        FlowError,
      );
    }
  });
});

/**
 * Long enough for the run's process to start, ask the model and start the command under a loaded
 * machine (the test watches the command run before the deadline ends it).
 */
const LOCAL_DEADLINE_MS = 6000;

describe("a local call whose subagent runs a long command past the deadline", () => {
  let root: string;
  beforeAll(() => {
    ensureBuilt();
    root = mkdtempSync(join(tmpdir(), "crw-flow-deadline-"));
  }, 180_000);
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it("the turn is aborted with its command, the call held for its deadline and the run paused", async () => {
    const marker = `sleep ${(300 + Math.random()).toFixed(3)}`;
    const server = await startModelServer(() => ({
      tool: { name: "shell", arguments: { command: marker } },
    }));
    const repo = tempRepo("crw-flow-deadline-repo-").repo;
    const state = join(root, "state");
    const workflow = join(root, "wf.mjs");
    writeFileSync(
      workflow,
      `export default { name: "slow", run: (ctx) => ctx.call({ role: "explorer", task: "count", deadlineMs: ${LOCAL_DEADLINE_MS}, schema: { type: "object" } }) };\n`,
    );
    const env: NodeJS.ProcessEnv = plainEnv({ DEADLINE_TEST_KEY: "sk-deadline" });
    try {
      const start = await crwFlow(
        [
          "start",
          workflow,
          "--backend",
          "local",
          "--model",
          "openai-completions:deadline-probe",
          "--model-base-url",
          server.openaiBaseUrl,
          "--model-api-key-env",
          "DEADLINE_TEST_KEY",
          "--run",
          "slow",
          "--state",
          state,
          "--repo",
          repo,
          "--json",
        ],
        env,
        root,
      );
      expect(start.code, start.stderr).toBe(0);
      const journal = runPaths(state, "slow").journal;
      await waitFor("the command running", () => commandsRunning(marker) > 0, 30_000);
      const paused = await waitFor(
        "the run paused",
        () => existsSync(journal) && readJournalFile(journal).rows.find((x) => x.type === "run_paused"),
        30_000,
      );
      expect(paused).toMatchObject({ reason: "held:explorer.1" });
      const rows = readJournalFile(journal).rows;
      const thread = rows.find((x) => x.type === "thread_started");
      const held = rows.find((x) => x.type === "held");
      expect(held).toMatchObject({ call: "explorer.1", reason: "deadline" });
      expect(Date.parse(held?.at as string) - Date.parse(thread?.at as string)).toBeGreaterThanOrEqual(
        LOCAL_DEADLINE_MS,
      );
      await waitFor("the command gone", () => commandsRunning(marker) === 0, 10_000);
      expect(server.requests).toHaveLength(1);
    } finally {
      await server.close();
      rmSync(repo, { recursive: true, force: true });
    }
  }, 60_000);
});
