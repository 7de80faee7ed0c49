import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type JournalRow, readJournalFile, runPaths } from "../../src/index.js";
import { type CodexScenario, expectedResult, runCodexScenario } from "./codexScenario.js";

/**
 * The run's process killed with SIGKILL right after the architect's subagent was bound (its
 * thread_started + turn_started batch is durable, the answer not harvested), with the real
 * `codex app-server` as host. The owner goes on as it would: its report is answered queued (no process),
 * its next `crw flow next` resumes the run, and the resumed process reads the bound subagent from the
 * host and harvests the turn that completed meanwhile.
 */

let run: CodexScenario;
let rows: Array<JournalRow & Record<string, unknown>>;

beforeAll(async () => {
  run = await runCodexScenario({ startPrefix: "CRW_FLOW_FAULT=after:turn_started:1" });
  rows = readJournalFile(runPaths(run.state, run.owner.runId as string).journal).rows as typeof rows;
}, 200_000);

afterAll(async () => {
  await run?.stop();
});

describe("crw flow killed after a bind and resumed, with the real codex as host", () => {
  it("the first process died after the bind and `next` resumed the run in a second process", () => {
    expect(run.owner.failure).toBeNull();
    const started = rows.filter((r) => r.type === "started");
    expect(started).toHaveLength(2);
    expect(run.owner.resumedPids).toHaveLength(1);
    const firstStarted = rows.indexOf(started[1] as (typeof rows)[number]);
    const bound = rows.findIndex((r) => r.type === "turn_started" && r.call === "architect.1");
    expect(bound).toBeLessThan(firstStarted);
  });

  it("the resumed process harvested the turn the dead one had bound, from the host, without a new step (S000-147)", () => {
    const architect = rows.filter((r) => r.call === "architect.1");
    expect(architect.filter((r) => r.type === "step_published")).toHaveLength(1);
    expect(architect.filter((r) => r.type === "thread_started")).toHaveLength(1);
    const completed = architect.filter((r) => r.type === "completed");
    expect(completed).toHaveLength(1);
    expect(completed[0]).toMatchObject({
      result: { steps: ["parse the input", "write the output"] },
      tokens: { input: 1000, cached_input: 200, output: 50, reasoning_output: 10, total: 1050 },
    });
    // The dead process left the architect's step file; a `next` before the resumed process retracts it can
    // hand it out again, and the owner spawns a second architect. That one is answered close and never
    // bound (the attempt is bound to the first): thread_started stays one.
    const architectReplies = run.owner.replies.filter((r) => r.call === "architect.1");
    const boundAgent = architect.find((r) => r.type === "thread_started")?.thread_id;
    for (const reply of architectReplies) {
      if (reply.agent_id !== boundAgent) expect(reply).toMatchObject({ reply: "close" });
    }
  });

  it("the result equals the uninterrupted run's, and no call completed twice", () => {
    expect(rows.filter((r) => r.type === "run_ended")).toMatchObject([
      { status: "completed", result: expectedResult },
    ]);
    const completedCalls = rows.filter((r) => r.type === "completed").map((r) => r.call);
    expect(completedCalls.sort()).toEqual(["architect.1", "explorer.1", "reviewer.1"]);
  });
});
