import { addTokens, foldCall, type JournalRow, type RowOf, subtractTokens } from "@crw/flow";
import { describe, expect, it } from "vitest";

/**
 * The resume table (callFold.ts): where a call stands is read from its rows alone, so a resumed process
 * goes on exactly as the process that wrote them would have. Each case folds the rows a crash could leave.
 */

const CALL = "explore.1";
let seq = 0;
const at = "2026-01-01T00:00:00.000Z";
const callBase = () => ({ seq: seq++, at, call: CALL, op: CALL });

const prepared = (): RowOf<"prepared"> => ({
  ...callBase(),
  type: "prepared",
  role: "explorer",
  input: { role: "explorer", task: "t", schema: null, workspace: null },
  input_digest: "sha256:in",
  backend: "session",
  allocation: { workspace: "/p", kind: "scratch" },
});

const stepRow = (over: Partial<RowOf<"step_published">> = {}): RowOf<"step_published"> => ({
  ...callBase(),
  type: "step_published",
  k: 1,
  marker: `${CALL}/t1-a1`,
  attempt: 1,
  action: "spawn",
  input: "t",
  input_digest: "sha256:i",
  packet: "/p/packet.md",
  packet_digest: "sha256:p",
  role: "explorer",
  agent_type: "explorer",
  model: null,
  effort: null,
  workspace: "/p",
  conversation_turn: 1,
  ...over,
});

const threadRow = (thread_id: string, attempt = 1): RowOf<"thread_started"> => ({
  seq: seq++,
  at,
  type: "thread_started",
  call: CALL,
  thread_id,
  model: null,
  effort: null,
  cwd: "/p",
  host_cwd: null,
  parent_thread_id: "owner",
  agent_role: "explorer",
  attempt,
  via: "session",
  rollout_path: null,
  marker: `${CALL}/t1-a${attempt}`,
});

const turnRow = (turn_id: string, k = 1, attempt = 1): RowOf<"turn_started"> => ({
  ...callBase(),
  type: "turn_started",
  k,
  turn_id,
  attempt,
  marker: `${CALL}/t${k}-a${attempt}`,
});

const lost = (attempt: number, agent_id: string, turn_status: string | null = "inProgress") =>
  ({
    ...callBase(),
    type: "session_attempt_lost",
    attempt,
    agent_id,
    k: 1,
    turn_id: null,
    reason: "no change for 1000 ms",
    host_status: "notLoaded",
    turn_status,
  }) satisfies RowOf<"session_attempt_lost">;

const held = (reason: string, detail?: string): RowOf<"held"> => ({
  ...callBase(),
  type: "held",
  reason,
  ...(detail ? { detail } : {}),
});

const fold = (rows: JournalRow[]) => foldCall(rows);

describe("the resume table: where a call stands after its last row", () => {
  it("a call with no rows has no position; a prepared call publishes its first spawn", () => {
    expect(fold([])).toEqual({
      prepared: null,
      position: null,
      threads: [],
      interrupt: null,
      steps: [],
      lostAttempts: [],
    });
    const p = prepared();
    const f = fold([p]);
    expect(f.prepared).toBe(p);
    expect(f.position).toEqual({
      kind: "publish",
      next: { k: 1, attempt: 1, action: "spawn", conversation_turn: 1, close: [] },
    });
  });

  it("a published step waits for its bind; a bound subagent is adopted; its turn is harvested", () => {
    const s = stepRow();
    expect(fold([prepared(), s]).position).toEqual({ kind: "await_bind", step: s });
    const th = threadRow("sub-1");
    const adopted = fold([prepared(), s, th]);
    expect(adopted.position).toEqual({ kind: "adopt", step: s, thread: th });
    expect(adopted.threads).toEqual([th]);
    const tu = turnRow("turn-1");
    expect(fold([prepared(), s, th, tu]).position).toEqual({
      kind: "harvest",
      step: s,
      thread: th,
      turn: tu,
    });
  });

  it("a thread row with no step before it moves nothing, and a turn with no bound thread moves nothing", () => {
    const f = fold([prepared(), threadRow("sub-1")]);
    expect(f.position?.kind).toBe("publish");
    expect(f.threads).toHaveLength(1);
    expect(fold([prepared(), stepRow(), turnRow("turn-1")]).position?.kind).toBe("await_bind");
  });

  it("a repair send_input after a harvest keeps the subagent bound: its turn is harvested on it", () => {
    const th = threadRow("sub-1");
    const s2 = stepRow({ k: 2, action: "send_input", agent_id: "sub-1", conversation_turn: 2 });
    const tu2 = turnRow("turn-2", 2);
    const f = fold([prepared(), stepRow(), th, turnRow("turn-1"), s2, tu2]);
    expect(f.position).toEqual({ kind: "harvest", step: s2, thread: th, turn: tu2 });
    expect(f.steps.map((s) => s.k)).toEqual([1, 2]);
  });

  it("a new spawn step forgets the previous subagent: a turn row alone does not bind the old one", () => {
    const s2 = stepRow({ k: 2, attempt: 2 });
    const f = fold([
      prepared(),
      stepRow(),
      threadRow("sub-1"),
      turnRow("turn-1"),
      s2,
      turnRow("turn-x", 2, 2),
    ]);
    expect(f.position).toEqual({ kind: "await_bind", step: s2 });
  });

  it("a lost attempt publishes the next attempt's spawn, closing the lost subagent and replacing its turn", () => {
    const s = stepRow({
      repair: { answer: "a", errors: ["e"] },
      call_tokens: { input: 5 },
      conversation_turn: 2,
      k: 3,
    });
    const f = fold([prepared(), s, threadRow("sub-1"), turnRow("turn-1", 3), lost(1, "sub-1")]);
    expect(f.lostAttempts).toEqual([1]);
    expect(f.position).toEqual({
      kind: "publish",
      next: {
        k: 3,
        attempt: 2,
        action: "spawn",
        note: "The previous attempt (1) was cut off: no change for 1000 ms (thread notLoaded, turn inProgress).",
        repair: { answer: "a", errors: ["e"] },
        call_tokens: { input: 5 },
        conversation_turn: 2,
        replaces_turn: 2,
        close: [{ attempt: 1, agent_id: "sub-1" }],
      },
    });
  });

  it("a loss before any step (or without a turn status) still publishes a first-turn spawn", () => {
    const f = fold([prepared(), lost(1, "sub-1", null)]);
    expect(f.position).toEqual({
      kind: "publish",
      next: {
        k: 1,
        attempt: 2,
        action: "spawn",
        note: "The previous attempt (1) was cut off: no change for 1000 ms (thread notLoaded, turn none).",
        conversation_turn: 1,
        replaces_turn: 1,
        close: [{ attempt: 1, agent_id: "sub-1" }],
      },
    });
  });

  it("a hold after a loss, before the next step, keeps the lost subagent's close for the step after the hold", () => {
    const f = fold([
      prepared(),
      stepRow(),
      threadRow("sub-1"),
      turnRow("turn-1"),
      lost(1, "sub-1"),
      held("usage_limit"),
    ]);
    expect(f.position).toMatchObject({
      kind: "publish",
      next: {
        attempt: 2,
        note: "The previous attempt (1) was stopped: usage_limit.",
        close: [{ attempt: 1, agent_id: "sub-1" }],
      },
    });
    expect(f.position).not.toHaveProperty("next.settle");
  });

  it("after a loss the next step binds a new subagent, not the lost one", () => {
    const s2 = stepRow({ attempt: 2, marker: `${CALL}/t1-a2` });
    const f = fold([prepared(), stepRow(), threadRow("sub-1"), turnRow("turn-1"), lost(1, "sub-1"), s2]);
    expect(f.position).toEqual({ kind: "await_bind", step: s2 });
    const th2 = threadRow("sub-2", 2);
    const g = fold([
      prepared(),
      stepRow(),
      threadRow("sub-1"),
      lost(1, "sub-1"),
      s2,
      th2,
      turnRow("t2", 1, 2),
    ]);
    expect(g.position).toMatchObject({ kind: "harvest", thread: th2 });
  });

  it("a held call with a bound subagent goes on with the next step and attempt, once that subagent runs nothing, closing it", () => {
    const s = stepRow({ call_tokens: { output: 3 }, repair: { answer: "x", errors: ["bad"] } });
    const f = fold([
      prepared(),
      s,
      threadRow("sub-1"),
      turnRow("turn-1"),
      held("usage_limit", "rate: slow down"),
    ]);
    expect(f.position).toEqual({
      kind: "publish",
      next: {
        k: 2,
        attempt: 2,
        action: "spawn",
        note: "The previous attempt (1) was stopped: usage_limit (rate: slow down).",
        repair: { answer: "x", errors: ["bad"] },
        call_tokens: { output: 3 },
        conversation_turn: 1,
        replaces_turn: 1,
        close: [{ attempt: 1, agent_id: "sub-1" }],
        settle: ["sub-1"],
      },
    });
  });

  it("a held call whose step was never bound looks that step up by its marker before a new one", () => {
    const s = stepRow();
    const f = fold([prepared(), s, held("owner_interrupt")]);
    expect(f.position).toEqual({
      kind: "publish",
      next: {
        k: 2,
        attempt: 2,
        action: "spawn",
        note: "The previous attempt (1) was stopped: owner_interrupt.",
        conversation_turn: 1,
        replaces_turn: 1,
        close: [],
        lookupFirst: s,
      },
    });
  });

  it("a call held before any step publishes attempt 1 and says attempt 1 stopped", () => {
    const f = fold([prepared(), held("host_failure")]);
    expect(f.position).toEqual({
      kind: "publish",
      next: {
        k: 1,
        attempt: 1,
        action: "spawn",
        note: "The previous attempt (1) was stopped: host_failure.",
        conversation_turn: 1,
        close: [],
      },
    });
  });

  it("a hold counts attempts from the newest of the step's and the bound subagent's", () => {
    const s = stepRow({ attempt: 1 });
    const f = fold([prepared(), s, threadRow("sub-3", 3), turnRow("turn-1"), held("x")]);
    expect(f.position).toMatchObject({
      kind: "publish",
      next: { attempt: 4, close: [{ attempt: 3, agent_id: "sub-3" }] },
    });
    const g = fold([
      prepared(),
      stepRow({ attempt: 5 }),
      threadRow("sub-1", 2),
      turnRow("turn-1", 1, 5),
      held("x"),
    ]);
    expect(g.position).toMatchObject({ kind: "publish", next: { attempt: 6 } });
  });

  it("a send_input looked up after a hold binds its turn to the subagent the step names", () => {
    const th = threadRow("sub-1");
    const s2 = stepRow({ k: 2, action: "send_input", agent_id: "sub-1", attempt: 1 });
    const tu = turnRow("turn-2", 2);
    const f = fold([prepared(), stepRow(), th, turnRow("turn-1"), held("x"), s2, tu]);
    expect(f.position).toEqual({ kind: "harvest", step: s2, thread: th, turn: tu });
  });

  it("a hold while a repair send_input waits for its bind closes the subagent it was sent to", () => {
    const s2 = stepRow({ k: 2, action: "send_input", agent_id: "sub-1", conversation_turn: 2 });
    const f = fold([prepared(), stepRow(), threadRow("sub-1"), turnRow("turn-1"), s2, held("x")]);
    expect(f.position).toMatchObject({
      kind: "publish",
      next: { k: 3, attempt: 2, close: [{ attempt: 1, agent_id: "sub-1" }], lookupFirst: s2 },
    });
  });

  it("a hold after a send_input that was bound does not look the step up again", () => {
    const th = threadRow("sub-1");
    const s2 = stepRow({ k: 2, action: "send_input", agent_id: "sub-1" });
    const f = fold([
      prepared(),
      stepRow(),
      th,
      turnRow("turn-1"),
      held("x"),
      s2,
      turnRow("turn-2", 2),
      held("y"),
    ]);
    expect(f.position?.kind === "publish" && f.position.next.lookupFirst).toBeUndefined();
    expect(f.position).toMatchObject({ next: { k: 3, close: [{ attempt: 1, agent_id: "sub-1" }] } });
  });

  it("completed and null_model are terminal, and the newest interrupt intent is kept", () => {
    const i1 = {
      ...callBase(),
      type: "interrupt_requested" as const,
      reason: "a",
      k: 1,
      attempt: 1,
      turn_id: null,
    };
    const i2 = { ...i1, seq: seq++, reason: "b" };
    const done: RowOf<"completed"> = {
      ...callBase(),
      type: "completed",
      k: 1,
      attempt: 1,
      result: {},
      result_digest: "d",
      raw_text: "{}",
      extracted: false,
      tokens: {},
    };
    const f = fold([prepared(), stepRow(), i1, i2, done]);
    expect(f.position).toEqual({ kind: "terminal", row: done });
    expect(f.interrupt).toBe(i2);
    const nm: RowOf<"null_model"> = { ...callBase(), type: "null_model", reason: "r", tokens: {} };
    expect(fold([prepared(), nm]).position).toEqual({ kind: "terminal", row: nm });
  });

  it("preparing the call again starts over from its first spawn, forgetting the old step and subagent", () => {
    const f = fold([prepared(), stepRow(), threadRow("sub-1"), prepared(), turnRow("turn-1")]);
    expect(f.position).toEqual({
      kind: "publish",
      next: { k: 1, attempt: 1, action: "spawn", conversation_turn: 1, close: [] },
    });
  });
});

describe("token parts", () => {
  it("adds part by part, reads a missing part as 0, and leaves a 0 part out", () => {
    expect(addTokens({ input: 2, output: 0 }, { input: 3, total: 4 })).toEqual({ input: 5, total: 4 });
    expect(addTokens(undefined, { cached_input: 1, reasoning_output: 2 })).toEqual({
      cached_input: 1,
      reasoning_output: 2,
    });
    expect(addTokens(undefined, undefined)).toEqual({});
  });

  it("subtracts part by part, never below 0, leaving a 0 part out", () => {
    expect(
      subtractTokens(
        { input: 10, cached_input: 4, output: 3, reasoning_output: 2, total: 19 },
        { input: 4, cached_input: 4, output: 5, total: 9 },
      ),
    ).toEqual({ input: 6, reasoning_output: 2, total: 10 });
    expect(subtractTokens({ output: 1 }, undefined)).toEqual({ output: 1 });
    expect(subtractTokens(undefined, { output: 1 })).toEqual({});
  });
});
