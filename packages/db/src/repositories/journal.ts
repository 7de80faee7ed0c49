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

/**
 * The exact content parts the agent loop produced for an assistant message, for providers that need them
 * back (thinking blocks and their signatures, text and tool-call signatures). `content` stays the journal's
 * view (text and tool calls, in the same order); `providerContent`, when present, is what the provider
 * request replays, byte for byte.
 */
export const providerTextPartSchema = z
  .object({ type: z.literal("text"), text: z.string(), textSignature: z.string().optional() })
  .strict();
export const providerThinkingPartSchema = z
  .object({
    type: z.literal("thinking"),
    thinking: z.string(),
    thinkingSignature: z.string().optional(),
    redacted: z.boolean().optional(),
  })
  .strict();
export const providerToolCallPartSchema = z
  .object({
    type: z.literal("toolCall"),
    id,
    name: id,
    arguments: z.record(z.string(), z.unknown()),
    thoughtSignature: z.string().optional(),
  })
  .strict();
export const providerContentPartSchema = z.discriminatedUnion("type", [
  providerTextPartSchema,
  providerThinkingPartSchema,
  providerToolCallPartSchema,
]);

export const userMessageSchema = z.object({ role: z.literal("user"), content: z.string() }).strict();
export const assistantMessageSchema = z
  .object({
    role: z.literal("assistant"),
    content: z.array(z.discriminatedUnion("type", [textContentSchema, toolCallContentSchema])),
    stopReason: z.enum(["stop", "toolUse", "error", "aborted"]),
    errorMessage: z.string().optional(),
    model: z.string().optional(),
    /** Which provider API and provider produced it (a provider replays its own private parts only). */
    api: z.string().max(200).optional(),
    provider: z.string().max(200).optional(),
    providerContent: z.array(providerContentPartSchema).optional(),
  })
  .strict()
  .superRefine((m, ctx) => {
    if (!m.providerContent) return;
    // The journal's view must be exactly the text and tool calls of the provider parts, in order.
    const view: unknown[] = [];
    for (const p of m.providerContent) {
      if (p.type === "text") view.push({ type: "text", text: p.text });
      else if (p.type === "toolCall")
        view.push({ type: "toolCall", id: p.id, name: p.name, arguments: p.arguments });
    }
    if (JSON.stringify(view) !== JSON.stringify(m.content)) {
      ctx.addIssue({ code: "custom", message: "content must be the text and tool calls of providerContent" });
    }
  });
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
export type ProviderContentPart = z.infer<typeof providerContentPartSchema>;
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

/**
 * The usage one provider response reported, as the agent loop saw it: stored with the assistant row that
 * records the response (its own column, outside the row's JSON). Field names follow the runner pool's
 * `providerUsage` frame. `cost` only when the model's prices are known.
 */
export const providerUsageSchema = z
  .object({
    api: z.string().min(1).max(128),
    provider: z.string().min(1).max(128),
    model: z.string().min(1).max(256),
    stopReason: z.string().min(1).max(64),
    input: z.number().int().min(0),
    output: z.number().int().min(0),
    cacheRead: z.number().int().min(0),
    cacheWrite: z.number().int().min(0),
    totalTokens: z.number().int().min(0),
    cost: z.number().min(0).optional(),
  })
  .strict();
export type ProviderUsage = z.infer<typeof providerUsageSchema>;

/** Whether a recorded usage carries figures (a response that failed before the provider counted reports none). */
export function bearsUsage(usage: ProviderUsage | null | undefined): usage is ProviderUsage {
  return !!usage && usage.input + usage.output + usage.cacheRead + usage.cacheWrite + usage.totalTokens > 0;
}

export interface JournalWrite {
  readonly body: JournalBody;
  /** The provider usage of the response an assistant message records (assistant messages only). */
  readonly usage?: ProviderUsage;
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
