import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type JournalRow, readJournalFile, readSpec, runPaths } from "../../src/index.js";
import { type CodexScenario, codexThreadIdOf, expectedResult, runCodexScenario } from "./codexScenario.js";

/**
 * Issue 3 end to end, offline, with the real `codex app-server` as host: the mock Responses model plays
 * the owner (it runs `crw flow start`, `crw flow next --json` and `crw flow dispatched` through Codex's
 * shell tool with the absolute path of the built CLI, and spawns with spawn_agent / repairs with
 * send_input) and the subagents (they answer JSON; the explorer answers invalid JSON once, so the repair
 * runs). The workflow has a parallel pair of calls. The run's process reaches the same app-server over
 * ws. The test asserts the journal rows and the workflow's result.
 */

let run: CodexScenario;
let root: string;
let state: string;
let owner: CodexScenario["owner"];
let ownerThreadId: string;
let ownerLog: string[];
let explorerTurns: { n: number };

beforeAll(async () => {
  run = await runCodexScenario();
  ({ root, state, owner, ownerThreadId, ownerLog, explorerTurns } = run);
}, 200_000);

afterAll(async () => {
  await run?.stop();
});

describe("crw flow end to end with the real codex as host", () => {
  let rows: JournalRow[];
  const ofType = (type: string) =>
    rows.filter((r) => r.type === type) as Array<JournalRow & Record<string, unknown>>;

  it("the owner started the run from its shell and stepped it to the end", () => {
    expect(owner.failure).toBeNull();
    expect(owner.runId, ownerLog.join("\n")).toBeTruthy();
    expect(owner.finalState, ownerLog.join("\n")).toMatchObject({
      state: "ended",
      ended: { status: "completed" },
    });
    rows = readJournalFile(runPaths(state, owner.runId as string).journal).rows;
    expect(rows.length).toBeGreaterThan(0);
  });

  it("the started row records the session backend and the owner from CODEX_THREAD_ID (S000-005 S000-180)", () => {
    expect(ofType("started")[0]).toMatchObject({ backend: "session" });
    expect(readSpec(runPaths(state, owner.runId as string).spec)).toMatchObject({
      backend: "session",
      owner: ownerThreadId,
    });
  });

  it("the workflow's result is the schema-valid answers of its calls", () => {
    expect(ofType("run_ended")).toMatchObject([
      {
        status: "completed",
        result: expectedResult,
      },
    ]);
  });

  it("each call bound the subagent the owner spawned under its thread; thread_started names P, the host's cwd and the rollout (S000-014 S000-075)", () => {
    const threads = ofType("thread_started");
    expect(threads).toHaveLength(3);
    for (const t of threads) {
      expect(t).toMatchObject({
        parent_thread_id: ownerThreadId,
        via: "session",
        attempt: 1,
        host_cwd: join(root, "repo"),
        marker: `${t.call}/t1-a1`,
        agent_role: expect.any(String),
      });
      // The call's cwd is its own directory P under the run, never the host's (the owner's) cwd.
      expect(String(t.cwd)).toContain(join(state, "flow", owner.runId as string));
      expect(t.cwd).not.toBe(t.host_cwd);
      expect(String(t.rollout_path)).toMatch(/rollout-.*\.jsonl$/);
      expect(String(t.thread_id)).toBe(codexThreadIdOf(String(t.rollout_path)));
    }
    const byModel = Object.fromEntries(threads.map((t) => [t.model, t]));
    expect(Object.keys(byModel).sort()).toEqual(["mock-architect", "mock-explorer", "mock-reviewer"]);
    expect(byModel["mock-architect"]).toMatchObject({ effort: "high" });
    expect(byModel["mock-explorer"]).toMatchObject({ effort: "low" });
    // The run also finds a subagent by its marker, so a fast subagent is bound (and even harvested) before
    // the owner's report arrives: the report is then answered close (the attempt ended) or, once the
    // run's process has ended, queued. Nothing is refused, mismatched or left to retry.
    const replies = owner.replies.map((r) => r.reply);
    expect(replies, JSON.stringify(owner.replies)).toHaveLength(4);
    for (const reply of replies) expect(["bound", "close", "queued"]).toContain(reply);
    const boundAgents = new Set(threads.map((t) => t.thread_id));
    for (const r of owner.replies) if (r.reply !== "queued") expect(boundAgents).toContain(r.agent_id);
  });

  it("a role whose effort is undecided is bound on its model; thread_started records the host's effort with effort_unchecked (S000-069)", () => {
    const reviewer = ofType("thread_started").find((t) => t.model === "mock-reviewer");
    // gpt-5.5's catalog entry (cloned for the mock models) defaults to medium.
    expect(reviewer).toMatchObject({ effort: "medium", effort_unchecked: true });
    expect(ofType("thread_started").find((t) => t.model === "mock-architect")).not.toHaveProperty(
      "effort_unchecked",
    );
  });

  it("the spawn message and the repair's send_input message reached the subagents as crw wrote them (S000-035 S000-039)", () => {
    const spawns = owner.hostCalls.filter((c) => c.tool === "spawn_agent");
    expect(spawns).toHaveLength(3);
    for (const spawn of spawns) {
      const lines = String(spawn.arguments.message).split("\n");
      expect(lines[0]).toMatch(/^crw-flow-op: [a-z]+\.1\/t1-a1$/);
      expect(lines[1]).toMatch(/^CRW-ROLE: (architect|explorer|reviewer)$/);
      expect(lines[2]).toBe("");
      // short: the packet holds the rest (three lines of rules and its path, no section of the packet)
      expect(lines.slice(3).filter((l) => l !== "")).toHaveLength(3);
      expect(String(spawn.arguments.message)).not.toContain("## ");
    }
    const repair = owner.hostCalls.find((c) => c.tool === "send_input");
    const text = String(repair?.arguments.message);
    expect(text.split("\n")[0]).toBe("crw-flow-op: explorer.1/t2-a1");
    // then the turn's input itself: the repair instruction, right after the marker line
    expect(text.split("\n")[1]).toMatch(/^Your final message did not satisfy the output contract/);
    expect(text).toContain("I looked around but I am not sure.");
  });

  it("the answer is the final_answer message, never the commentary; prose before the JSON is taken out and recorded (S000-084 S000-086 S000-087)", () => {
    const completed = ofType("completed");
    expect(completed).toHaveLength(3);
    const architect = completed.find((c) => JSON.stringify(c.result).includes("parse the input"));
    expect(architect).toMatchObject({
      raw_text: 'Here is the plan: {"steps":["parse the input","write the output"]}',
      extracted: true,
      result_digest: expect.stringMatching(/^sha256:/),
    });
    // Every subagent said "Reading the packet." (commentary) first: no call took it.
    for (const c of completed) expect(c.raw_text).not.toContain("Reading the packet.");
  });

  it("the explorer's invalid answer was repaired once with send_input on its open subagent (S000-027)", () => {
    const published = ofType("step_published");
    const explorerSteps = published.filter((p) => p.role === "explorer");
    expect(explorerSteps.map((p) => p.action)).toEqual(["spawn", "send_input"]);
    const repair = explorerSteps[1] as Record<string, unknown>;
    expect(String(repair.previous_answer ?? JSON.stringify(repair))).toContain("not sure");
    expect(explorerTurns.n).toBe(2);
    expect(owner.hostCalls.filter((c) => c.tool === "send_input")).toHaveLength(1);
  });

  // The mock model's usage per response: the explorer's task turn and its repair each counted this.
  const explorerTurn = { input: 1000, cached_input: 200, output: 50, reasoning_output: 10, total: 1050 };
  const explorerTokens = () =>
    ofType("completed").find((c) => JSON.stringify(c.result).includes("parse.ts"))?.tokens as
      | Record<string, number>
      | undefined;

  it("a token part that is 0 is left out of the row: the reviewer's has no cached_input or reasoning_output (S000-095)", () => {
    const reviewer = ofType("completed").find((c) => JSON.stringify(c.result) === '{"verdict":"ok"}');
    expect(reviewer?.tokens).toEqual({ input: 1000, output: 50, total: 1050 });
  });

  it("the repair step records what the explorer's task turn counted before it, as tokens_seen and call_tokens (S000-020)", () => {
    const repair = ofType("step_published").find((p) => p.role === "explorer" && p.action === "send_input");
    expect(repair).toMatchObject({ tokens_seen: explorerTurn, call_tokens: explorerTurn });
  });

  it("a call's tokens come from its subagent's rollout: two turns on one subagent count as the rollout's last total (S000-093)", () => {
    expect(explorerTokens()?.total).toBe(2 * explorerTurn.total);
    expect(explorerTokens()?.input).toBe(2 * explorerTurn.input);
  });

  it("every token part, cached input and reasoning output included, is counted on its own (S000-094)", () => {
    expect(explorerTokens()).toEqual({
      input: 2000,
      cached_input: 400,
      output: 100,
      reasoning_output: 20,
      total: 2100,
    });
  });

  it("the parallel pair ran at once: both steps were published before either call completed", () => {
    const firstCompletedAfterPlan = rows.findIndex(
      (r, i) => r.type === "completed" && i > rows.findIndex((x) => x.type === "completed"),
    );
    const pairSpawns = rows
      .map((r, i) => ({ r: r as Record<string, unknown>, i }))
      .filter(
        (x) =>
          x.r.type === "step_published" &&
          (x.r.role === "explorer" || x.r.role === "reviewer") &&
          x.r.action === "spawn",
      );
    expect(pairSpawns).toHaveLength(2);
    for (const s of pairSpawns) expect(s.i).toBeLessThan(firstCompletedAfterPlan);
  });
});
