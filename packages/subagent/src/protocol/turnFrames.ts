import type { AssistantMessage } from "@crw/db";
import {
  anyText,
  array,
  boolean,
  byKey,
  type Check,
  firstOf,
  type Issue,
  integer,
  isObject,
  literal,
  matching,
  nullable,
  number,
  oneOf,
  optional,
  record,
  refined,
  strictObject,
  text,
  unknownValue,
} from "./check.js";
import type { OutputFrameOf } from "./output.js";

/**
 * The frames a runner sends for every session turn (its progress, its records, its `turnHost` calls, its reply), checked
 * without the schema library: the daemon reads several per delegated turn, and the schemas' generic walk
 * was a measurable share of the daemon's CPU per turn. Each entry mirrors outputFrameSchema (output.ts) and
 * the schemas it uses (sessionTurn.ts, envelope.ts, @crw/db's journal messages and provider usage); the
 * schemas stay the contract and the type, and test/turnFrames.test.ts holds both to the same verdicts and
 * parsed values. A frame refused here is parsed again by the schema, whose issues are the ones reported.
 */
const requestId = text(1, 128);
const turnId = text(1, 128);
/** Ids of sessionTurn.ts and of the journal's messages. */
const id = text(1, 200);
/** z.uuid()'s pattern. */
const uuid = matching(
  /^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$/,
  "a UUID",
);
const args = record(() => true, "a string", unknownValue);

const progressEvent = byKey("type", {
  text: strictObject({ type: literal("text"), sessionId: id, text: text(0, 65_536) }),
  tool: strictObject({ type: literal("tool"), sessionId: id, toolName: id, toolCallId: id }),
  compaction: strictObject({ type: literal("compaction"), sessionId: id }),
  session: strictObject({ type: literal("session"), sessionId: id, parentSessionId: nullable(id) }),
});

const textContent = strictObject({ type: literal("text"), text: anyText });
const toolCallContent = strictObject({ type: literal("toolCall"), id, name: id, arguments: args });

const providerContentPart = byKey("type", {
  text: strictObject({ type: literal("text"), text: anyText, textSignature: optional(anyText) }),
  thinking: strictObject({
    type: literal("thinking"),
    thinking: anyText,
    thinkingSignature: optional(anyText),
    redacted: optional(boolean),
  }),
  toolCall: strictObject({
    type: literal("toolCall"),
    id,
    name: id,
    arguments: args,
    thoughtSignature: optional(anyText),
  }),
});

/** The schema's refinement, computed the same way: the journal's view is the provider parts' text and calls. */
function viewMatchesProviderContent(m: AssistantMessage): boolean {
  if (!m.providerContent) return true;
  const view: unknown[] = [];
  for (const p of m.providerContent) {
    if (p.type === "text") view.push({ type: "text", text: p.text });
    else if (p.type === "toolCall")
      view.push({ type: "toolCall", id: p.id, name: p.name, arguments: p.arguments });
  }
  return JSON.stringify(view) === JSON.stringify(m.content);
}

const assistantMessage = refined(
  strictObject({
    role: literal("assistant"),
    content: array(byKey("type", { text: textContent, toolCall: toolCallContent })),
    stopReason: oneOf(["stop", "toolUse", "error", "aborted"]),
    errorMessage: optional(anyText),
    model: optional(anyText),
    api: optional(text(0, 200)),
    provider: optional(text(0, 200)),
    providerContent: optional(array(providerContentPart)),
  }) as Check<AssistantMessage>,
  viewMatchesProviderContent,
  "content must be the text and tool calls of providerContent",
);

const toolResultMessage = strictObject({
  role: literal("toolResult"),
  toolCallId: id,
  toolName: id,
  content: anyText,
  isError: boolean,
  details: optional(
    strictObject({
      resultId: uuid,
      childSessionId: optional(uuid),
      runId: optional(uuid),
      outcome: optional(oneOf(["ok", "error"])),
      spillPath: optional(anyText),
      byteSize: optional(integer(0)),
    }),
  ),
});

const count = integer(0);
const cost = number(0, Number.POSITIVE_INFINITY, false);
/** The journal's usage (`cost` optional); the `providerUsage` frame's own always has a `cost`. */
function usageWith<C>(cost: Check<C>) {
  return strictObject({
    api: text(1, 128),
    provider: text(1, 128),
    model: text(1, 256),
    stopReason: text(1, 64),
    input: count,
    output: count,
    cacheRead: count,
    cacheWrite: count,
    totalTokens: count,
    cost,
  });
}

const turnRecord = strictObject({
  message: firstOf(assistantMessage, toolResultMessage),
  usage: optional(usageWith(optional(cost))),
});

const turnHostCall = byKey("op", {
  beforeToolCall: strictObject({ op: literal("beforeToolCall"), call: toolCallContent }),
  drainSteering: strictObject({ op: literal("drainSteering") }),
  executeTool: strictObject({ op: literal("executeTool"), toolName: id, toolCallId: id, args }),
});

const remoteError = strictObject({ name: text(1, 128), message: text(0, 16_384), code: text(1, 128) });
function envelope<T>(ok: Check<T>) {
  return firstOf(strictObject({ ok }), strictObject({ error: remoteError }));
}

const frames: Record<string, Check<unknown>> = {
  turnProgress: strictObject({
    type: literal("turnProgress"),
    requestId,
    turnId,
    event: progressEvent,
  }),
  turnHost: strictObject({ type: literal("turnHost"), requestId, turnId, call: turnHostCall }),
  turnRecord: strictObject({ type: literal("turnRecord"), requestId, turnId, record: turnRecord }),
  sessionTurnReply: strictObject({
    type: literal("sessionTurnReply"),
    requestId,
    result: envelope(
      strictObject({
        stopReason: oneOf(["stop", "error", "aborted"]),
        errorMessage: optional(anyText),
      }),
    ),
    record: optional(turnRecord),
  }),
  providerUsage: strictObject({ type: literal("providerUsage"), requestId, turnId, usage: usageWith(cost) }),
};

export type TurnFrame = OutputFrameOf<
  "turnProgress" | "turnHost" | "turnRecord" | "sessionTurnReply" | "providerUsage"
>;

/**
 * A session turn's frame as the schema would parse it, or undefined: the frame is of another type or is
 * refused (the caller parses it with the schema then, for the verdict and its issues).
 */
export function checkTurnFrame(raw: unknown): TurnFrame | undefined {
  if (!isObject(raw) || typeof raw.type !== "string" || !Object.hasOwn(frames, raw.type)) return undefined;
  const issues: Issue[] = [];
  const frame = (frames[raw.type] as Check<unknown>)(raw, [], issues);
  return issues.length === 0 ? (frame as TurnFrame) : undefined;
}
