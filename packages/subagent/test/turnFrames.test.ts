import { checkTurnFrame, outputFrameSchema, parseOutputFrame } from "@crw/subagent";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { intNear, mostly, recordOf, strangeValue, textNear } from "./support/arbitraries.js";

/**
 * The daemon checks a session turn's frames (turnProgress, turnRecord, turnHost, sessionTurnReply,
 * providerUsage) by hand (protocol/turnFrames.ts) before the schema. The frames come from another process, so the check must
 * accept exactly what the schema accepts and parse it to the same value; what it refuses, the schema parses
 * again for its issues.
 */
const turnTypes = new Set(["turnProgress", "turnHost", "turnRecord", "sessionTurnReply", "providerUsage"]);

function agrees(raw: unknown): boolean {
  const schema = outputFrameSchema.safeParse(raw);
  const own = checkTurnFrame(raw);
  const isTurnFrame =
    typeof raw === "object" && raw !== null && turnTypes.has((raw as { type?: unknown }).type as string);
  expect(own !== undefined, JSON.stringify(schema.success ? "" : schema.error.issues)).toBe(
    isTurnFrame && schema.success,
  );
  if (own !== undefined && schema.success) expect(own).toStrictEqual(schema.data);
  const parsed = parseOutputFrame(raw);
  expect(parsed.ok).toBe(schema.success);
  if (parsed.ok && schema.success) expect(parsed.frame).toStrictEqual(schema.data);
  return schema.success;
}

const NONE = Symbol("none");
/** An object of the given fields, now and then with one key dropped or an unknown one added. */
function shaped(fields: Record<string, fc.Arbitrary<unknown>>, optionalKeys: readonly string[] = []) {
  const keys = Object.keys(fields);
  const requiredKeys = keys.filter((k) => !optionalKeys.includes(k));
  return fc
    .record({
      value: fc.record(fields, { requiredKeys }),
      drop: fc.oneof({ arbitrary: fc.constant(NONE), weight: 15 }, fc.constantFrom(...keys)),
      extra: fc.oneof({ arbitrary: fc.constant(NONE), weight: 15 }, fc.anything({ maxDepth: 1 })),
    })
    .map(({ value, drop, extra }) => {
      const out: Record<string, unknown> = { ...value };
      if (drop !== NONE) delete out[drop];
      if (extra !== NONE) out.extra = extra;
      return out;
    });
}

const tag = (value: string, others: readonly unknown[]) =>
  mostly(fc.constant(value), fc.constantFrom(...others));
const anyText = mostly(fc.string({ maxLength: 12 }), strangeValue);
const args = mostly(recordOf(fc.string({ maxLength: 6 }), fc.anything({ maxDepth: 1 })), strangeValue);
const bool = mostly(fc.boolean(), strangeValue);

const progressEvent = fc.oneof(
  shaped({ type: tag("text", ["tool", "Text"]), sessionId: textNear(1, 200), text: textNear(0, 65_536) }),
  shaped({
    type: tag("tool", ["text"]),
    sessionId: textNear(1, 200),
    toolName: textNear(1, 200),
    toolCallId: textNear(1, 200),
  }),
  shaped({ type: tag("compaction", ["session", undefined]), sessionId: textNear(1, 200) }),
  shaped({
    type: tag("session", ["compaction"]),
    sessionId: textNear(1, 200),
    parentSessionId: fc.oneof(fc.constant(null), textNear(1, 200)),
  }),
  strangeValue,
);

const toolCall = shaped({
  type: tag("toolCall", ["text", "thinking"]),
  id: textNear(1, 200),
  name: textNear(1, 200),
  arguments: args,
});
const textPart = shaped({ type: tag("text", ["toolCall"]), text: anyText });
const providerPart = fc.oneof(
  shaped({ type: tag("text", ["thinking"]), text: anyText, textSignature: anyText }, ["textSignature"]),
  shaped({ type: tag("thinking", ["text"]), thinking: anyText, thinkingSignature: anyText, redacted: bool }, [
    "thinkingSignature",
    "redacted",
  ]),
  shaped(
    {
      type: tag("toolCall", ["text"]),
      id: textNear(1, 200),
      name: textNear(1, 200),
      arguments: args,
      thoughtSignature: anyText,
    },
    ["thoughtSignature"],
  ),
  strangeValue,
);

/** The journal's view of provider parts, as the schema's refinement computes it (mostly consistent). */
function viewOf(parts: unknown[]): unknown[] {
  const view: unknown[] = [];
  for (const p of parts as Record<string, unknown>[]) {
    if (typeof p !== "object" || p === null) continue;
    if (p.type === "text") view.push({ type: "text", text: p.text });
    else if (p.type === "toolCall")
      view.push({ type: "toolCall", id: p.id, name: p.name, arguments: p.arguments });
  }
  return view;
}

const assistantFields = {
  role: tag("assistant", ["toolResult", "user"]),
  content: mostly(fc.array(fc.oneof(textPart, toolCall, strangeValue), { maxLength: 3 }), strangeValue),
  stopReason: mostly(fc.constantFrom("stop", "toolUse", "error", "aborted"), fc.constantFrom("end", "Stop")),
  errorMessage: anyText,
  model: anyText,
  api: textNear(0, 200),
  provider: textNear(0, 200),
};
const assistantOptional = ["errorMessage", "model", "api", "provider"];
const assistant = fc.oneof(
  shaped(assistantFields, assistantOptional),
  // With provider parts: the view mostly derived from them, so the refinement holds.
  fc
    .record({
      message: shaped(assistantFields, assistantOptional),
      parts: mostly(fc.array(providerPart, { maxLength: 3 }), strangeValue),
      derived: fc.boolean(),
    })
    .map(({ message, parts, derived }) => ({
      ...message,
      providerContent: parts,
      ...(derived && Array.isArray(parts) ? { content: viewOf(parts) } : {}),
    })),
);

const uuidText = mostly(
  fc.uuid(),
  fc.constantFrom(
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "FFFFFFFF-FFFF-4FFF-BFFF-FFFFFFFFFFFF",
    "12345678-1234-9234-8234-123456789abc",
    "12345678-1234-4234-c234-123456789abc",
    "12345678-1234-4234-8234-123456789abc\n",
    "not-a-uuid",
  ),
);
const toolResult = shaped({
  role: tag("toolResult", ["assistant"]),
  toolCallId: textNear(1, 200),
  toolName: textNear(1, 200),
  content: anyText,
  isError: bool,
  details: fc.option(
    mostly(
      shaped(
        {
          resultId: uuidText,
          childSessionId: uuidText,
          runId: uuidText,
          outcome: mostly(fc.constantFrom("ok", "error"), fc.constant("fine")),
          spillPath: anyText,
          byteSize: intNear(0),
        },
        ["childSessionId", "runId", "outcome", "spillPath", "byteSize"],
      ),
      strangeValue,
    ),
    { nil: undefined },
  ),
});

const usage = mostly(
  shaped(
    {
      api: textNear(1, 128),
      provider: textNear(1, 128),
      model: textNear(1, 256),
      stopReason: textNear(1, 64),
      input: intNear(0),
      output: intNear(0),
      cacheRead: intNear(0),
      cacheWrite: intNear(0),
      totalTokens: intNear(0),
      cost: mostly(fc.double({ min: 0, noNaN: true }), fc.double()),
    },
    ["cost"],
  ),
  strangeValue,
);

const turnRecord = mostly(
  shaped({ message: fc.oneof(assistant, toolResult), usage }, ["usage"]),
  strangeValue,
);

const turnHostCall = fc.oneof(
  shaped({ op: tag("beforeToolCall", ["record"]), call: toolCall }),
  shaped({ op: tag("drainSteering", ["executeTool", "drain"]) }),
  shaped({
    op: tag("executeTool", ["record"]),
    toolName: textNear(1, 200),
    toolCallId: textNear(1, 200),
    args,
  }),
  strangeValue,
);

const outcome = shaped(
  {
    stopReason: mostly(fc.constantFrom("stop", "error", "aborted"), fc.constantFrom("end", "toolUse")),
    errorMessage: anyText,
  },
  ["errorMessage"],
);
const remoteError = shaped({ name: textNear(1, 128), message: textNear(0, 16_384), code: textNear(1, 128) });
const result = fc.oneof(
  shaped({ ok: outcome }),
  shaped({ error: remoteError }),
  fc.record({ ok: outcome, error: remoteError }),
  strangeValue,
);

const otherTypes = ["turnReply", "progress", "hello", "TurnHost", undefined];
const frame = fc.oneof(
  shaped({
    type: tag("turnProgress", otherTypes),
    requestId: textNear(1, 128),
    turnId: textNear(1, 128),
    event: progressEvent,
  }),
  shaped({
    type: tag("turnHost", otherTypes),
    requestId: textNear(1, 128),
    turnId: textNear(1, 128),
    call: turnHostCall,
  }),
  shaped({
    type: tag("turnRecord", otherTypes),
    requestId: textNear(1, 128),
    turnId: textNear(1, 128),
    record: turnRecord,
  }),
  shaped(
    { type: tag("sessionTurnReply", otherTypes), requestId: textNear(1, 128), result, record: turnRecord },
    ["record"],
  ),
  shaped({
    type: tag("providerUsage", otherTypes),
    requestId: textNear(1, 128),
    turnId: textNear(1, 128),
    usage,
  }),
);

const assistantRecord = {
  type: "turnRecord",
  requestId: "r-1",
  turnId: "t-1",
  record: {
    message: {
      role: "assistant",
      content: [
        { type: "text", text: "done" },
        { type: "toolCall", id: "c1", name: "Delegate", arguments: { task: "x" } },
      ],
      stopReason: "toolUse",
      providerContent: [
        { type: "thinking", thinking: "hm", thinkingSignature: "sig" },
        { type: "text", text: "done" },
        { type: "toolCall", id: "c1", name: "Delegate", arguments: { task: "x" } },
      ],
    },
  },
};

/** An answered call of the turn, the frame the intents, drains and host tools go in. */
const hostCall = { type: "turnHost", requestId: "r-2", turnId: "t-1", call: { op: "drainSteering" } };

describe("a session turn's frames, checked by hand on the daemon's side, get the schema's verdicts", () => {
  it("same verdict and same parsed frame for generated frames, valid and not (property)", () => {
    let accepted = 0;
    let refused = 0;
    fc.assert(
      fc.property(frame, (raw) => {
        if (agrees(raw)) accepted++;
        else refused++;
      }),
      { numRuns: 4_000 },
    );
    // Both verdicts must be well represented, or the property proves little.
    expect(accepted).toBeGreaterThan(400);
    expect(refused).toBeGreaterThan(400);
  });

  it("the same verdicts in the form a frame crosses the channel (JSON), own __proto__ keys included", () => {
    fc.assert(
      fc.property(frame, (raw) => {
        const wire = JSON.stringify(raw);
        agrees(wire === undefined ? null : JSON.parse(wire));
      }),
      { numRuns: 1_000 },
    );
    for (const text of [
      `{"arguments":{"__proto__":{"x":1}}}`,
      `{"__proto__":{"x":1}}`,
      `{"arguments":{},"__proto__":"x"}`,
    ]) {
      const part = { type: "toolCall", id: "c", name: "n", ...JSON.parse(text) };
      agrees({ ...hostCall, call: { op: "beforeToolCall", call: part } });
      agrees({
        ...hostCall,
        call: { op: "executeTool", toolName: "n", toolCallId: "c", args: part.arguments },
      });
    }
  });

  it("values that are not frames, or frames of other types", () => {
    fc.assert(
      fc.property(
        fc.anything({ withNullPrototype: true, withObjectString: true, withSparseArray: true }),
        (raw) => {
          agrees(raw);
          if (typeof raw === "object" && raw !== null) agrees({ ...raw, type: "turnHost" });
        },
      ),
    );
    for (const raw of [
      null,
      undefined,
      "turnHost",
      ["turnHost"],
      { type: "turnHost" },
      { type: "constructor" },
    ]) {
      expect(agrees(raw)).toBe(false);
    }
    // Frames the hand check leaves to the schema.
    expect(agrees({ type: "progress", requestId: "r", turnId: "t", text: "x" })).toBe(true);
    expect(checkTurnFrame({ type: "progress", requestId: "r", turnId: "t", text: "x" })).toBeUndefined();
  });

  it("edges each schema rule draws, one at a time", () => {
    const message = assistantRecord.record.message;
    const withMessage = (m: Record<string, unknown>) => ({ ...assistantRecord, record: { message: m } });
    // A hole reads as undefined, as the schema reads it (an array with a hole never crosses the channel).
    const sparse: unknown[] = [{ type: "text", text: "a" }];
    sparse[2] = { type: "text", text: "b" };
    const cases: unknown[] = [
      assistantRecord,
      withMessage({ ...message, providerContent: undefined }),
      withMessage({ ...message, content: message.content.slice(1) }),
      withMessage({ ...message, content: [...message.content].reverse() }),
      withMessage({
        ...message,
        providerContent: [{ type: "thinking", thinking: "x", redacted: 1 }],
        content: [],
      }),
      withMessage({ role: "assistant", content: sparse, stopReason: "stop" }),
      withMessage({ role: "assistant", content: [], stopReason: "stop", api: "a".repeat(201) }),
      withMessage({ role: "assistant", content: [], stopReason: "stop", api: "😀".repeat(200) }),
      withMessage(Object.assign(Object.create({ stopReason: "stop" }), { role: "assistant", content: [] })),
      withMessage({ role: "toolResult", toolCallId: "c", toolName: "n", content: "", isError: false }),
      withMessage({
        role: "toolResult",
        toolCallId: "c",
        toolName: "n",
        content: "",
        isError: false,
        details: { resultId: "00000000-0000-0000-0000-000000000000", byteSize: 1.5 },
      }),
      { ...assistantRecord, turnId: "t".repeat(129) },
      { ...hostCall, call: { op: "drainSteering", extra: undefined } },
      { ...hostCall, call: { op: "record", message } },
      {
        type: "sessionTurnReply",
        requestId: "r",
        result: { ok: { stopReason: "stop" } },
        record: { message },
      },
      {
        type: "sessionTurnReply",
        requestId: "r",
        result: { ok: { stopReason: "stop" } },
        record: { message: {} },
      },
      {
        type: "sessionTurnReply",
        requestId: "r",
        result: { ok: { stopReason: "stop", errorMessage: undefined } },
      },
      { type: "sessionTurnReply", requestId: "r", result: { error: { name: "E", message: "", code: "c" } } },
      { type: "sessionTurnReply", requestId: "r", result: { ok: { stopReason: "stop" }, error: undefined } },
      {
        type: "turnProgress",
        requestId: "r",
        turnId: "t",
        event: { type: "text", sessionId: "s", text: "😀".repeat(65_536) },
      },
      {
        type: "turnProgress",
        requestId: "r",
        turnId: "t",
        event: { type: "text", sessionId: "s", text: "a".repeat(65_537) },
      },
      { type: "turnProgress", requestId: "r", turnId: "t", event: { type: "session", sessionId: "s" } },
      {
        type: "providerUsage",
        requestId: "r",
        turnId: "t",
        usage: {
          api: "a",
          provider: "p",
          model: "m",
          stopReason: "stop",
          input: 1,
          output: 2,
          cacheRead: 0,
          cacheWrite: 0,
          totalTokens: 3,
          cost: Number.POSITIVE_INFINITY,
        },
      },
    ];
    expect(cases.map(agrees)).toEqual(cases.map((c) => outputFrameSchema.safeParse(c).success));
    expect(agrees(assistantRecord)).toBe(true);
  });

  it("a refused frame is reported with the schema's issues", () => {
    const raw = { ...assistantRecord, record: { ...assistantRecord.record, extra: 1 } };
    const parsed = parseOutputFrame(raw);
    expect(parsed.ok).toBe(false);
    expect(parsed.ok ? "" : parsed.issues).toMatch(/record/);
    const issues = outputFrameSchema.safeParse(raw).error?.issues ?? [];
    expect(parsed.ok ? "" : parsed.issues).toContain(issues[0]?.message);
  });
});
