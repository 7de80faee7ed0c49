import { z } from "zod";
import type * as P from "./protocolTypes.js";

/**
 * zod schemas for what crw reads from the app-server, checked at the edge. They name only the members
 * crw uses (extra members pass through); the compile-time checks below prove that every value of the
 * generated protocol type is accepted, so the schemas cannot drift from the pinned binary's shapes.
 */

type Accepts<Schema extends z.ZodType, Generated> = [Generated] extends [z.input<Schema>] ? true : false;
const accepts = <_T extends true>() => undefined;

export const threadStatusWire = z.discriminatedUnion("type", [
  z.looseObject({ type: z.literal("idle") }),
  z.looseObject({ type: z.literal("notLoaded") }),
  z.looseObject({ type: z.literal("systemError") }),
  z.looseObject({ type: z.literal("active"), activeFlags: z.array(z.string()) }),
]);
accepts<Accepts<typeof threadStatusWire, P.ThreadStatus>>();

/** `codexErrorInfo` is a string kind or a one-key object (`{ httpConnectionFailed: {…} }`). */
export const codexErrorInfoWire = z.union([z.string(), z.record(z.string(), z.unknown())]);
accepts<Accepts<typeof codexErrorInfoWire, P.CodexErrorInfo>>();

export const turnErrorWire = z.looseObject({
  message: z.string(),
  codexErrorInfo: codexErrorInfoWire.nullable(),
});
accepts<Accepts<typeof turnErrorWire, P.TurnError>>();

export const userInputWire = z.looseObject({ type: z.string(), text: z.string().optional() });
accepts<Accepts<typeof userInputWire, P.UserInput>>();

const namedItemTypes = new Set(["userMessage", "agentMessage", "collabAgentToolCall"]);
export const threadItemWire = z.union([
  z.looseObject({ type: z.literal("userMessage"), id: z.string(), content: z.array(userInputWire) }),
  z.looseObject({
    type: z.literal("agentMessage"),
    id: z.string(),
    text: z.string(),
    phase: z.string().nullable().optional(),
  }),
  z.looseObject({
    type: z.literal("collabAgentToolCall"),
    id: z.string(),
    tool: z.string(),
    senderThreadId: z.string(),
    receiverThreadIds: z.array(z.string()),
    prompt: z.string().nullable(),
    model: z.string().nullable(),
    reasoningEffort: z.string().nullable(),
  }),
  // Every other item kind is kept by its kind only; a malformed item of a named kind fails above.
  z.looseObject({ type: z.string().refine((t) => !namedItemTypes.has(t)), id: z.string() }),
]);
accepts<Accepts<typeof threadItemWire, P.ThreadItem>>();

export const turnWire = z.looseObject({
  id: z.string(),
  items: z.array(threadItemWire),
  status: z.enum(["completed", "interrupted", "failed", "inProgress"]),
  error: turnErrorWire.nullable(),
});
accepts<Accepts<typeof turnWire, P.Turn>>();

export const threadWire = z.looseObject({
  id: z.string(),
  parentThreadId: z.string().nullable().optional(),
  agentRole: z.string().nullable().optional(),
  agentNickname: z.string().nullable().optional(),
  model: z.string().nullable().optional(),
  reasoningEffort: z.string().nullable().optional(),
  cwd: z.string().nullable().optional(),
  status: threadStatusWire,
  path: z.string().nullable().optional(),
  turns: z.array(turnWire).optional(),
});
accepts<Accepts<typeof threadWire, P.Thread>>();
export type ThreadWire = z.output<typeof threadWire>;

export const threadReadResponseWire = z.looseObject({ thread: threadWire });
accepts<Accepts<typeof threadReadResponseWire, P.ThreadReadResponse>>();

export const threadListResponseWire = z.looseObject({
  data: z.array(threadWire),
  nextCursor: z.string().nullable(),
});
accepts<Accepts<typeof threadListResponseWire, P.ThreadListResponse>>();

export const turnStartResponseWire = z.looseObject({ turn: turnWire });
accepts<Accepts<typeof turnStartResponseWire, P.TurnStartResponse>>();

export const threadStartResponseWire = z.looseObject({ thread: threadWire });
accepts<Accepts<typeof threadStartResponseWire, P.ThreadStartResponse>>();

export const configWarningWire = z.looseObject({
  summary: z.string(),
  details: z.string().nullable().optional(),
});
accepts<Accepts<typeof configWarningWire, P.ConfigWarningNotification>>();

/** What crw sends: typed by the generated params, so a renamed member fails the build. */
export type ThreadReadParams = P.ThreadReadParams;
export type ThreadListParams = P.ThreadListParams;
export type TurnStartParams = P.TurnStartParams;
export type TurnInterruptParams = P.TurnInterruptParams;
export type ThreadResumeParams = P.ThreadResumeParams;
export type ThreadStartParams = P.ThreadStartParams;
export type ThreadForkParams = P.ThreadForkParams;
export type InitializeParams = P.InitializeParams;
export type ThreadSourceKind = P.ThreadSourceKind;
