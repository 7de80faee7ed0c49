import {
  bootFrameSchema,
  envelope,
  errorToRemote,
  inputFrameSchema,
  parseBootFrame,
  parseInputFrame,
  parseOutputFrame,
  RunnerStartupError,
  tapCursorSchema,
} from "@crw/subagent";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { z } from "zod";

const policy = { revision: 3, maxRetries: 2, initialDelayMs: 100, multiplier: 2 };
const catalog = { revision: 1, public: [], accounts: {} };
const validInputs = [
  {
    type: "boot",
    requestId: "r1",
    runnerId: "run-1",
    buildId: "b",
    retryPolicy: policy,
    catalog,
    heartbeatIntervalMs: 1000,
  },
  { type: "turn", requestId: "r2", turn: { turnId: "t", channelId: "c", sessionId: "s", prompt: "p" } },
  { type: "abort", requestId: "r3", turnId: "t", interruption: { origin: "stop" } },
  { type: "release", requestId: "r4", sessionId: "s" },
  { type: "tap", requestId: "r5", tapId: "x", sessionId: "s", history: { limit: 10, before: "h1" } },
  { type: "untap", requestId: "r6", tapId: "x" },
  { type: "retryPolicyChanged", requestId: "r7", retryPolicy: policy },
  { type: "modelsChanged", requestId: "r8", catalog },
  { type: "hostRpcReply", requestId: "r9", result: { ok: { any: 1 } } },
  { type: "shutdown", requestId: "r10" },
];
const validOutputs = [
  { type: "hello", requestId: "h", buildId: "b", pid: 12 },
  { type: "bootReply", requestId: "r1", result: { ok: { buildId: "b", policyRevision: 1 } } },
  {
    type: "turnReply",
    requestId: "r2",
    result: { ok: { turnId: "t", sessionId: "s", text: "", stopReason: "end" } },
  },
  { type: "turnReply", requestId: "r2", result: { error: { name: "E", code: "c", message: "m" } } },
  { type: "releaseReply", requestId: "r4", result: { ok: { state: "busy" } } },
  {
    type: "tapReply",
    requestId: "r5",
    result: { ok: { sessionId: "s", model: null, history: [], live: [] } },
  },
  { type: "ack", requestId: "r6", result: { ok: {} } },
  {
    type: "heartbeat",
    requestId: "hb",
    seq: 1,
    eventLoopP99Ms: 1.5,
    rssBytes: 100,
    turns: 0,
    sessions: 0,
  },
  { type: "progress", requestId: "p", turnId: "t", text: "x" },
  { type: "tapEvent", requestId: "e", tapId: "x", event: { kind: "text", turnId: "t", text: "hi" } },
  { type: "hostRpc", requestId: "q", turnId: "t", method: "crw.api", params: { method: "GET", path: "/x" } },
  { type: "hostRpcCancel", requestId: "q2", rpcId: "q" },
];

describe("protocol frames", () => {
  it("every valid frame in both directions parses, each with a request id (S004-151)", () => {
    for (const f of validInputs) expect(parseInputFrame(f)).toMatchObject({ ok: true });
    for (const f of validOutputs) expect(parseOutputFrame(f)).toMatchObject({ ok: true });
  });

  it("replies carry an ok/error envelope with name and code, never both (S004-151)", () => {
    const e = envelope(z.number());
    expect(e.safeParse({ ok: 1 }).success).toBe(true);
    expect(e.safeParse({ error: { name: "X", code: "y", message: "z" } }).success).toBe(true);
    expect(e.safeParse({ ok: 1, error: { name: "X", code: "y", message: "z" } }).success).toBe(false);
    expect(e.safeParse({ error: { name: "X", message: "no code" } }).success).toBe(false);
    const remote = errorToRemote(new RunnerStartupError("boot_timeout", "late"));
    expect(remote).toEqual({ name: "RunnerStartupError", code: "runner_startup", message: "late" });
  });

  it("the boot frame's retryPolicy is required (S004-456)", () => {
    const { retryPolicy: _, ...noPolicy } = validInputs[0] as Record<string, unknown>;
    expect(parseInputFrame(noPolicy).ok).toBe(false);
  });

  it("validation freezes boot and retryPolicyChanged values (S004-457)", () => {
    const boot = bootFrameSchema.parse(validInputs[0]);
    expect(Object.isFrozen(boot)).toBe(true);
    expect(Object.isFrozen(boot.retryPolicy)).toBe(true);
    const changed = inputFrameSchema.parse(validInputs[6]);
    expect(Object.isFrozen(changed)).toBe(true);
    expect(() => {
      (boot.retryPolicy as { maxRetries: number }).maxRetries = 99;
    }).toThrow();
    // what the runner reads them with: its own boot parser, and the input frame parser for later frames
    const read = [
      parseBootFrame(validInputs[0]),
      parseInputFrame(validInputs[0]),
      parseInputFrame(validInputs[6]),
    ];
    for (const r of read) {
      if (!r.ok) throw new Error("a valid frame was refused");
      const frame = r.frame as { retryPolicy: { maxRetries: number } };
      expect(Object.isFrozen(frame)).toBe(true);
      expect(Object.isFrozen(frame.retryPolicy)).toBe(true);
      expect(() => {
        frame.retryPolicy.maxRetries = 99;
      }).toThrow();
      expect(frame.retryPolicy).toEqual(policy);
    }
  });

  it("a tap history.before cursor is 1 to 128 characters", () => {
    expect(tapCursorSchema.safeParse("a").success).toBe(true);
    expect(tapCursorSchema.safeParse("x".repeat(128)).success).toBe(true);
    expect(tapCursorSchema.safeParse("").success).toBe(false);
    expect(tapCursorSchema.safeParse("x".repeat(129)).success).toBe(false);
    const tap = validInputs[4] as { history: object };
    expect(parseInputFrame({ ...tap, history: { limit: 5, before: "" } }).ok).toBe(false);
    expect(parseInputFrame({ ...tap, history: { limit: 5, before: "y".repeat(129) } }).ok).toBe(false);
  });

  it("arbitrary values never throw and are refused unless they are valid frames (fuzz) (S004-151)", () => {
    fc.assert(
      fc.property(fc.anything({ withObjectString: true, withNullPrototype: true, maxDepth: 4 }), (raw) => {
        const i = parseInputFrame(raw);
        const o = parseOutputFrame(raw);
        if (i.ok) expect(inputFrameSchema.safeParse(raw).success).toBe(true);
        expect(typeof o.ok).toBe("boolean");
      }),
      { numRuns: 2000 },
    );
  });

  it("mutated valid frames (dropped, retyped or extra members) are refused (fuzz) (S004-151)", () => {
    const frames = [
      ...validInputs.map((f) => ["in", f] as const),
      ...validOutputs.map((f) => ["out", f] as const),
    ];
    fc.assert(
      fc.property(
        fc.constantFrom(...frames),
        fc.oneof(
          fc.record({ drop: fc.constantFrom("type", "requestId") }),
          fc.record({ extra: fc.string({ minLength: 1 }).filter((k) => !["type", "requestId"].includes(k)) }),
          fc.record({
            retype: fc.constantFrom("requestId", "type"),
            value: fc.oneof(fc.integer(), fc.constant(null), fc.constant("")),
          }),
          fc.record({ hostile: fc.constantFrom("__proto__", "constructor", "prototype") }),
        ),
        ([dir, frame], m) => {
          const copy: Record<string, unknown> = { ...frame };
          if ("drop" in m) delete copy[m.drop];
          else if ("extra" in m) {
            if (m.extra in copy) return;
            copy[m.extra] = 1;
          } else if ("retype" in m) copy[m.retype] = m.value;
          else Object.defineProperty(copy, m.hostile, { value: { polluted: true }, enumerable: true });
          const parsed = dir === "in" ? parseInputFrame(copy) : parseOutputFrame(copy);
          expect(parsed.ok).toBe(false);
          expect(({} as Record<string, unknown>).polluted).toBeUndefined();
        },
      ),
      { numRuns: 1000 },
    );
  });

  it("oversized strings and out-of-range numbers are refused (S004-151)", () => {
    expect(parseOutputFrame({ ...validOutputs[8], text: "x".repeat(513) }).ok).toBe(false);
    expect(parseOutputFrame({ ...validOutputs[0], pid: -1 }).ok).toBe(false);
    expect(parseInputFrame({ ...validInputs[0], heartbeatIntervalMs: 1 }).ok).toBe(false);
    expect(
      parseInputFrame({ ...validInputs[6], retryPolicy: { ...policy, initialDelayMs: 60_001 } }).ok,
    ).toBe(false);
    expect(parseOutputFrame({ ...validOutputs[10], method: "shell.exec" }).ok).toBe(false);
  });

  it("a turnHost record frame carries an assistant response's usage only in the journal's usage shape", () => {
    const message = {
      role: "assistant",
      content: [{ type: "text", text: "measured" }],
      api: "openai-completions",
      provider: "openai",
      model: "m",
      stopReason: "stop",
    };
    const usage = {
      api: "openai-completions",
      provider: "openai",
      model: "m",
      stopReason: "stop",
      input: 10,
      output: 6,
      cacheRead: 30,
      cacheWrite: 0,
      totalTokens: 46,
    };
    const frame = (record: object) => ({ type: "turnRecord", requestId: "r1", turnId: "t1", record });
    expect(parseOutputFrame(frame({ message })).ok).toBe(true);
    expect(parseOutputFrame(frame({ message, usage })).ok).toBe(true);
    expect(parseOutputFrame(frame({ message, usage: { ...usage, input: -1 } })).ok).toBe(false);
    expect(parseOutputFrame(frame({ message, usage: { ...usage, extra: 1 } })).ok).toBe(false);
    const { cacheRead: _, ...partial } = usage;
    expect(parseOutputFrame(frame({ message, usage: partial })).ok).toBe(false);
    // The turn's last record, carried by its reply, is held to the same shape.
    const reply = (record: object) => ({
      type: "sessionTurnReply",
      requestId: "r2",
      result: { ok: { stopReason: "stop" } },
      record,
    });
    expect(parseOutputFrame(reply({ message, usage })).ok).toBe(true);
    expect(parseOutputFrame(reply({ message, usage: partial })).ok).toBe(false);
  });
});
