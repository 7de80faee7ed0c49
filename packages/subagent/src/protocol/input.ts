import { z } from "zod";
import { envelope, requestIdSchema } from "./envelope.js";
import { localExecEventSchema, localExecFinalSchema } from "./localExec.js";
import { modelCatalogSchema, retryPolicySchema } from "./policy.js";
import { agentOptionsSchema, sessionTurnSchema } from "./sessionTurn.js";
import { delegatedTurnRequestSchema, tapCursorSchema } from "./turn.js";

/**
 * Frames the daemon sends to a runner. Each asks for exactly one answer (a reply frame carrying the same
 * `requestId`), except `hostRpcReply`, which answers the runner's own `hostRpc` request.
 */
const id = z.string().min(1).max(128);

export const bootFrameSchema = z
  .object({
    type: z.literal("boot"),
    requestId: requestIdSchema,
    runnerId: id,
    buildId: z.string().min(1).max(256),
    /** Required: a runner never reads a database or default policy, only this and later revisions. */
    retryPolicy: retryPolicySchema,
    catalog: modelCatalogSchema,
    heartbeatIntervalMs: z.number().int().min(10).max(600_000),
    /** The agent loop's provider options, as the daemon's own in-process loop has them. */
    agent: agentOptionsSchema.optional(),
  })
  .strict()
  .readonly();

export const inputFrameSchema = z.discriminatedUnion("type", [
  bootFrameSchema,
  z
    .object({ type: z.literal("turn"), requestId: requestIdSchema, turn: delegatedTurnRequestSchema })
    .strict(),
  z
    .object({
      type: z.literal("abort"),
      requestId: requestIdSchema,
      turnId: id,
      interruption: z.object({ origin: z.enum(["stop", "connection_lost", "shutdown"]) }).strict(),
    })
    .strict(),
  z.object({ type: z.literal("release"), requestId: requestIdSchema, sessionId: id }).strict(),
  z
    .object({
      type: z.literal("tap"),
      requestId: requestIdSchema,
      tapId: id,
      sessionId: id,
      history: z
        .object({ before: tapCursorSchema.optional(), limit: z.number().int().min(1).max(1000) })
        .strict(),
    })
    .strict(),
  z.object({ type: z.literal("untap"), requestId: requestIdSchema, tapId: id }).strict(),
  z
    .object({
      type: z.literal("retryPolicyChanged"),
      requestId: requestIdSchema,
      retryPolicy: retryPolicySchema,
    })
    .strict()
    .readonly(),
  z
    .object({ type: z.literal("modelsChanged"), requestId: requestIdSchema, catalog: modelCatalogSchema })
    .strict(),
  z
    .object({ type: z.literal("hostRpcReply"), requestId: requestIdSchema, result: envelope(z.unknown()) })
    .strict(),
  z.object({ type: z.literal("shutdown"), requestId: requestIdSchema }).strict(),
  z.object({ type: z.literal("sessionTurn"), requestId: requestIdSchema, turn: sessionTurnSchema }).strict(),
  /** The daemon's answer to a runner's `turnHost` call; the ok payload is validated per op by the runner. */
  z
    .object({ type: z.literal("turnHostReply"), requestId: requestIdSchema, result: envelope(z.unknown()) })
    .strict(),
  /** A partial event of a runner's local execution call (`requestId` is that call's id). */
  z
    .object({ type: z.literal("localExecEvent"), requestId: requestIdSchema, event: localExecEventSchema })
    .strict(),
  /** The final result that settles a local execution call. */
  z
    .object({
      type: z.literal("localExecResult"),
      requestId: requestIdSchema,
      result: envelope(localExecFinalSchema),
    })
    .strict(),
]);
export type InputFrame = z.infer<typeof inputFrameSchema>;
export type BootFrame = z.infer<typeof bootFrameSchema>;
export type InputFrameOf<T extends InputFrame["type"]> = Extract<InputFrame, { type: T }>;
