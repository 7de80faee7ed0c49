import {
  assistantMessageSchema,
  providerUsageSchema,
  resultDetailsSchema,
  toolCallContentSchema,
  toolResultMessageSchema,
  transcriptMessageSchema,
} from "@crw/db";
import { z } from "zod";

/**
 * A delegation-core session turn (brain's SessionTurnRunner seam) carried across the runner boundary. The
 * runner runs the model loop; everything the seam's TurnHost does (journal writes, tool intents, steering
 * drains) and every host tool's execution stay in the daemon and are reached by `turnHost` calls, so the
 * seam's ordering contract holds across the process boundary. Tools cross as declarations only.
 */
const id = z.string().min(1).max(200);

export const turnToolDeclarationSchema = z
  .object({
    name: id,
    description: z.string().max(65_536),
    parameters: z.record(z.string(), z.unknown()),
  })
  .strict();

/** Which SessionTurnRunner the runner uses: the agent loop (providers, scripted provider) or brain's scripted runner. */
export const sessionRunnerKindSchema = z.enum(["agent", "scripted"]);
export type SessionRunnerKind = z.infer<typeof sessionRunnerKindSchema>;

export const sessionTurnSchema = z
  .object({
    turnId: id,
    channelId: id,
    parentSessionId: id.optional(),
    runner: sessionRunnerKindSchema,
    request: z
      .object({
        sessionId: id,
        principalAccountId: id,
        model: z.string().min(1).max(256),
        systemPrompt: z.string().max(4_000_000),
        context: z.array(transcriptMessageSchema).max(100_000),
        tools: z.array(turnToolDeclarationSchema).max(512),
        /** Re-validated in the runner with the delegation core's own scope parser. */
        scope: z.unknown(),
        readOnly: z.boolean(),
        workDir: z.string().min(1).max(4096).nullable(),
      })
      .strict(),
  })
  .strict();
export type SessionTurnPayload = z.infer<typeof sessionTurnSchema>;

const agentApi = z.enum(["openai-responses", "openai-completions", "anthropic-messages"]);

/**
 * How the runner's agent loop maps model names to providers: the same options the daemon gives its own
 * in-process agent loop (base URLs, the env var holding each API's key, named scripts), so a turn behaves
 * the same in either placement. Keys themselves never cross: the runner reads the named env vars it inherited.
 */
export const agentOptionsSchema = z
  .object({
    baseUrls: z.partialRecord(agentApi, z.string().url().max(2048)).optional(),
    apiKeyEnv: z.partialRecord(agentApi, z.string().min(1).max(256)).optional(),
    scripts: z
      .record(z.string().min(1).max(200), z.array(z.record(z.string(), z.unknown())).max(10_000))
      .optional(),
  })
  .strict();
export type AgentOptions = z.infer<typeof agentOptionsSchema>;

export const turnOutcomeSchema = z
  .object({ stopReason: z.enum(["stop", "error", "aborted"]), errorMessage: z.string().optional() })
  .strict();

/**
 * A message of the turn for the daemon to journal (the seam's `record`): sent one way, in a `turnRecord`
 * frame or, for the turn's last one, in its `sessionTurnReply`.
 */
export const turnRecordSchema = z
  .object({
    message: z.union([assistantMessageSchema, toolResultMessageSchema]),
    /** The provider usage of the response an assistant message records, journaled with its row. */
    usage: providerUsageSchema.optional(),
  })
  .strict();
export type TurnRecord = z.infer<typeof turnRecordSchema>;

/**
 * The seam's TurnHost operations that answer, plus host tool execution, as calls from the runner to the
 * daemon. Each is taken after every record the runner sent before it.
 */
export const turnHostCallSchema = z.discriminatedUnion("op", [
  z.object({ op: z.literal("beforeToolCall"), call: toolCallContentSchema }).strict(),
  z.object({ op: z.literal("drainSteering") }).strict(),
  z
    .object({
      op: z.literal("executeTool"),
      toolName: id,
      toolCallId: id,
      args: z.record(z.string(), z.unknown()),
    })
    .strict(),
]);
export type TurnHostCall = z.infer<typeof turnHostCallSchema>;

/** Answers, per op: beforeToolCall -> null, drainSteering -> messages, executeTool -> tool output. */
export const drainSteeringAnswerSchema = z.array(transcriptMessageSchema);
export const toolOutputSchema = z
  .object({ content: z.string(), isError: z.boolean().optional(), details: resultDetailsSchema.optional() })
  .strict();

export const progressEventSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("text"), sessionId: id, text: z.string().max(65_536) }).strict(),
  z.object({ type: z.literal("tool"), sessionId: id, toolName: id, toolCallId: id }).strict(),
  z.object({ type: z.literal("compaction"), sessionId: id }).strict(),
  z.object({ type: z.literal("session"), sessionId: id, parentSessionId: id.nullable() }).strict(),
]);
