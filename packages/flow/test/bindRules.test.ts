import { type HostThread, type HostTurn, judgeBind, markerTurn, type RowOf } from "@crw/flow";
import { describe, expect, it } from "vitest";

const OWNER = "owner-thread";
const MARKER = "explore.1/t1-a1";

function step(over: Partial<RowOf<"step_published">> = {}): RowOf<"step_published"> {
  return {
    seq: 1,
    at: "2026-01-01T00:00:00.000Z",
    type: "step_published",
    call: "explore.1",
    op: "explore.1",
    k: 1,
    marker: MARKER,
    attempt: 1,
    action: "spawn",
    input: "task",
    input_digest: "sha256:i",
    packet: "/p/packet.md",
    packet_digest: "sha256:p",
    role: "explorer",
    agent_type: "explorer",
    model: "gpt-x",
    effort: "high",
    workspace: "/w",
    conversation_turn: 1,
    ...over,
  };
}

function turn(id: string, texts: Array<{ type: "userMessage" | "agentMessage"; text: string }>): HostTurn {
  return {
    id,
    status: "completed",
    error: null,
    items: texts.map((t, i) =>
      t.type === "userMessage"
        ? { type: "userMessage", id: `${id}-${i}`, text: t.text }
        : { type: "agentMessage", id: `${id}-${i}`, text: t.text, phase: "final_answer" },
    ),
  };
}

function thread(over: Partial<HostThread> = {}): HostThread {
  return {
    id: "sub-1",
    parentThreadId: OWNER,
    agentRole: "explorer",
    agentNickname: null,
    model: "gpt-x",
    reasoningEffort: "high",
    cwd: "/w",
    status: { type: "idle" },
    rolloutPath: null,
    turns: [turn("turn-1", [{ type: "userMessage", text: `crw-flow-op: ${MARKER}\nread the packet` }])],
    ...over,
  };
}

const decided = { model: "gpt-x", effort: "high" };

describe("binding a subagent to a step", () => {
  it("binds the owner's subagent whose turn carries the marker and runs the role's pair, all checked", () => {
    const v = judgeBind(step(), thread(), OWNER, decided);
    expect(v).toEqual({
      verdict: "bind",
      turn: thread().turns[0],
      pairUnchecked: false,
      effortUnchecked: false,
      agentRoleMismatch: null,
    });
  });

  it("refuses a thread that is not a subagent of the owner thread, naming both", () => {
    const v = judgeBind(step(), thread({ parentThreadId: "someone-else" }), OWNER, decided);
    expect(v.verdict).toBe("refused");
    expect(v.verdict === "refused" && v.reason).toMatch(/sub-1.*owner-thread/);
  });

  it("refuses a send_input step for another subagent, and binds it for its own", () => {
    const other = judgeBind(step({ action: "send_input", agent_id: "sub-2" }), thread(), OWNER, decided);
    expect(other.verdict).toBe("refused");
    expect(other.verdict === "refused" && other.reason).toContain("sub-2");
    const own = judgeBind(step({ action: "send_input", agent_id: "sub-1" }), thread(), OWNER, decided);
    expect(own.verdict).toBe("bind");
  });

  it("lets a spawn step bind whatever subagent id the host gave it", () => {
    expect(judgeBind(step({ agent_id: "sub-9" }), thread(), OWNER, decided).verdict).toBe("bind");
  });

  it("asks to retry while no turn carries the marker yet", () => {
    const v = judgeBind(step(), thread({ turns: [] }), OWNER, decided);
    expect(v.verdict).toBe("retry");
    expect(v.verdict === "retry" && v.reason).toContain(MARKER);
  });

  it("reports a model the role does not run as a pair mismatch carrying the role's pair", () => {
    const v = judgeBind(step(), thread({ model: "gpt-small" }), OWNER, decided);
    expect(v).toMatchObject({ verdict: "pair_mismatch", pair: decided });
    expect(v.verdict === "pair_mismatch" && v.reason).toMatch(/gpt-small.*gpt-x/);
    const unknown = judgeBind(step(), thread({ model: null }), OWNER, decided);
    expect(unknown.verdict === "pair_mismatch" && unknown.reason).toContain("(unknown)");
  });

  it("reports an effort the role does not run as a pair mismatch when the model is decided", () => {
    const v = judgeBind(step(), thread({ reasoningEffort: "low" }), OWNER, decided);
    expect(v).toMatchObject({ verdict: "pair_mismatch", pair: decided });
    expect(v.verdict === "pair_mismatch" && v.reason).toMatch(/effort low.*high/);
    const unknown = judgeBind(step(), thread({ reasoningEffort: null }), OWNER, decided);
    expect(unknown.verdict === "pair_mismatch" && unknown.reason).toContain("(unknown)");
  });

  it("checks nothing of an undecided role's pair and marks the bind pair_unchecked", () => {
    const pair = { model: null, effort: "high" };
    const v = judgeBind(step(), thread({ model: "any", reasoningEffort: "low" }), OWNER, pair);
    expect(v).toMatchObject({ verdict: "bind", pairUnchecked: true, effortUnchecked: false });
  });

  it("a role with neither part decided is pair_unchecked only, never effort_unchecked", () => {
    const v = judgeBind(step(), thread(), OWNER, { model: null, effort: null });
    expect(v).toMatchObject({ verdict: "bind", pairUnchecked: true, effortUnchecked: false });
  });

  it("checks only the model of a role with an undecided effort and marks the bind effort_unchecked", () => {
    const pair = { model: "gpt-x", effort: null };
    const v = judgeBind(step(), thread({ reasoningEffort: "low" }), OWNER, pair);
    expect(v).toMatchObject({ verdict: "bind", pairUnchecked: false, effortUnchecked: true });
    expect(judgeBind(step(), thread({ model: "other" }), OWNER, pair).verdict).toBe("pair_mismatch");
  });

  it("binds a subagent of another agent role but records the role mismatch", () => {
    const v = judgeBind(step(), thread({ agentRole: "worker" }), OWNER, decided);
    expect(v).toMatchObject({
      verdict: "bind",
      agentRoleMismatch: { expected: "explorer", actual: "worker" },
    });
    const none = judgeBind(step(), thread({ agentRole: null }), OWNER, decided);
    expect(none).toMatchObject({
      verdict: "bind",
      agentRoleMismatch: { expected: "explorer", actual: null },
    });
  });
});

describe("finding the step's turn by its marker", () => {
  it("finds the later turn whose first user message carries the marker", () => {
    const t = thread({
      turns: [
        turn("turn-0", [{ type: "userMessage", text: "crw-flow-op: other.1/t1-a1" }]),
        turn("turn-1", [
          { type: "agentMessage", text: `crw-flow-op: ${MARKER}` },
          { type: "userMessage", text: `crw-flow-op: ${MARKER}\nread` },
        ]),
      ],
    });
    expect(markerTurn(t, MARKER)?.id).toBe("turn-1");
  });

  it("ignores the marker in a turn's second user message or in the middle of a text", () => {
    const t = thread({
      turns: [
        turn("turn-1", [
          { type: "userMessage", text: "hello" },
          { type: "userMessage", text: `crw-flow-op: ${MARKER}` },
        ]),
        turn("turn-2", [{ type: "userMessage", text: `see\ncrw-flow-op: ${MARKER}` }]),
        turn("turn-3", [{ type: "agentMessage", text: `crw-flow-op: ${MARKER}` }]),
      ],
    });
    expect(markerTurn(t, MARKER)).toBeNull();
  });
});
