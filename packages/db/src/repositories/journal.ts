import { z } from "zod";

/**
 * The journal's message shapes, decoded from the original JSON text in TypeScript on every read and
 * validated on every write. A row that does not parse is a typed error, never silently skipped.
 */
const uuid = z.uuid();
const id = z.string().min(1).max(200);

export const textContentSchema = z.object({ type: z.literal("text"), text: z.string() }).strict();
export const toolCallContentSchema = z
  .object({
    type: z.literal("toolCall"),
    id,
    name: id,
    arguments: z.record(z.string(), z.unknown()),
  })
  .strict();

export const userMessageSchema = z.object({ role: z.literal("user"), content: z.string() }).strict();
export const assistantMessageSchema = z
  .object({
    role: z.literal("assistant"),
    content: z.array(z.discriminatedUnion("type", [textContentSchema, toolCallContentSchema])),
    stopReason: z.enum(["stop", "toolUse", "error", "aborted"]),
    errorMessage: z.string().optional(),
    model: z.string().optional(),
  })
  .strict();
export const resultDetailsSchema = z
  .object({
    resultId: uuid,
    childSessionId: uuid.optional(),
    runId: uuid.optional(),
    outcome: z.enum(["ok", "error"]).optional(),
    spillPath: z.string().optional(),
    byteSize: z.number().int().nonnegative().optional(),
  })
  .strict();
export const toolResultMessageSchema = z
  .object({
    role: z.literal("toolResult"),
    toolCallId: id,
    toolName: id,
    content: z.string(),
    isError: z.boolean(),
    details: resultDetailsSchema.optional(),
  })
  .strict();
/** A host-made message in the transcript; a delivered result carries `details.resultId`. */
export const customMessageSchema = z
  .object({
    role: z.literal("custom"),
    customType: z.enum(["delegation_result", "steer", "interrupted"]),
    content: z.string(),
    details: resultDetailsSchema.optional(),
  })
  .strict();

export const transcriptMessageSchema = z.discriminatedUnion("role", [
  userMessageSchema,
  assistantMessageSchema,
  toolResultMessageSchema,
  customMessageSchema,
]);

export type TextContent = z.infer<typeof textContentSchema>;
export type ToolCallContent = z.infer<typeof toolCallContentSchema>;
export type UserMessage = z.infer<typeof userMessageSchema>;
export type AssistantMessage = z.infer<typeof assistantMessageSchema>;
export type ToolResultMessage = z.infer<typeof toolResultMessageSchema>;
export type CustomMessage = z.infer<typeof customMessageSchema>;
export type ResultDetails = z.infer<typeof resultDetailsSchema>;
export type TranscriptMessage = z.infer<typeof transcriptMessageSchema>;

/** What one journal row holds. `seq` orders a session's rows; one writer appends them. */
export const journalBodySchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("message"), message: transcriptMessageSchema }).strict(),
  /** A compaction summarises everything before `firstKeptSeq`; the rows stay (and still prove delivery). */
  z
    .object({ type: z.literal("compaction"), summary: z.string(), firstKeptSeq: z.number().int().positive() })
    .strict(),
  /** Written before a tool runs: a tool_intent with no toolResult after a crash is of unknown outcome. */
  z
    .object({
      type: z.literal("tool_intent"),
      toolCallId: id,
      toolName: id,
      arguments: z.record(z.string(), z.unknown()),
    })
    .strict(),
]);
export type JournalBody = z.infer<typeof journalBodySchema>;

export interface JournalEntry {
  readonly sessionId: string;
  readonly seq: number;
  readonly body: JournalBody;
  readonly settled: boolean;
  readonly createdAt: Date;
}

export interface JournalWrite {
  readonly body: JournalBody;
  /** false: a provisional row of a turn still running (recovery settles or discards it). Default true. */
  readonly settled?: boolean;
}

/** The result id a body carries, if any: the storage key of exactly-once delivery. */
export function resultIdOf(body: JournalBody): string | undefined {
  if (body.type !== "message") return undefined;
  const m = body.message;
  if (m.role === "custom" || m.role === "toolResult") return m.details?.resultId;
  return undefined;
}
