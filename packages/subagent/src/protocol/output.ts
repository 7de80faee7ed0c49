import { z } from "zod";
import { providerUsageSchema } from "../providerUsage.js";
import { envelope, requestIdSchema } from "./envelope.js";
import { hostRpcMethodSchema } from "./hostRpcMethods.js";
import { localExecRequestSchema } from "./localExec.js";
import {
  progressEventSchema,
  turnHostCallSchema,
  turnOutcomeSchema,
  turnRecordSchema,
} from "./sessionTurn.js";
import { delegatedTurnResultSchema, tapEventSchema, tapSnapshotSchema } from "./turn.js";

/**
 * Frames a runner sends to the daemon: replies (one per daemon request, same `requestId`) and unsolicited
 * frames (hello, heartbeat, progress, tap events, reverse host calls) whose `requestId` the runner mints.
 */
const id = z.string().min(1).max(128);
const count = z.number().int().min(0).max(1_000_000);

export const releaseStateSchema = z.enum(["released", "busy", "failed"]);
export type ReleaseState = z.infer<typeof releaseStateSchema>;

export const heartbeatFrameSchema = z
  .object({
    type: z.literal("heartbeat"),
    requestId: requestIdSchema,
    seq: count,
    eventLoopP99Ms: z.number().min(0).max(3_600_000),
    rssBytes: z.number().int().min(0),
    turns: count,
    sessions: count,
    /** Daemon-private: kill tokens of processes the runner started, for cleanup after runner death. */
    containment: z
      .object({ revision: count, killTokens: z.array(z.string().min(1).max(256)).max(4096) })
      .strict()
      .optional(),
  })
  .strict();
export type HeartbeatFrame = z.infer<typeof heartbeatFrameSchema>;

export const outputFrameSchema = z.discriminatedUnion("type", [
  z
    .object({
      type: z.literal("hello"),
      requestId: requestIdSchema,
      buildId: z.string().min(1).max(256),
      pid: z.number().int().positive(),
    })
    .strict(),
  z
    .object({
      type: z.literal("bootReply"),
      requestId: requestIdSchema,
      result: envelope(z.object({ buildId: z.string().min(1).max(256), policyRevision: count }).strict()),
    })
    .strict(),
  z
    .object({
      type: z.literal("turnReply"),
      requestId: requestIdSchema,
      result: envelope(delegatedTurnResultSchema),
    })
    .strict(),
  z
    .object({
      type: z.literal("releaseReply"),
      requestId: requestIdSchema,
      result: envelope(z.object({ state: releaseStateSchema }).strict()),
    })
    .strict(),
  z
    .object({ type: z.literal("tapReply"), requestId: requestIdSchema, result: envelope(tapSnapshotSchema) })
    .strict(),
  z
    .object({ type: z.literal("ack"), requestId: requestIdSchema, result: envelope(z.object({}).strict()) })
    .strict(),
  heartbeatFrameSchema,
  z
    .object({
      type: z.literal("progress"),
      requestId: requestIdSchema,
      turnId: id,
      text: z.string().max(512),
    })
    .strict(),
  z
    .object({ type: z.literal("tapEvent"), requestId: requestIdSchema, tapId: id, event: tapEventSchema })
    .strict(),
  z
    .object({
      type: z.literal("hostRpc"),
      requestId: requestIdSchema,
      turnId: id,
      method: hostRpcMethodSchema,
      params: z.unknown(),
    })
    .strict(),
  z.object({ type: z.literal("hostRpcCancel"), requestId: requestIdSchema, rpcId: requestIdSchema }).strict(),
  z
    .object({
      type: z.literal("sessionTurnReply"),
      requestId: requestIdSchema,
      result: envelope(turnOutcomeSchema),
      /** The turn's last record, carried by its reply rather than a frame of its own. */
      record: turnRecordSchema.optional(),
    })
    .strict(),
  z
    .object({
      type: z.literal("turnRecord"),
      requestId: requestIdSchema,
      turnId: id,
      record: turnRecordSchema,
    })
    .strict(),
  z
    .object({ type: z.literal("turnHost"), requestId: requestIdSchema, turnId: id, call: turnHostCallSchema })
    .strict(),
  z
    .object({
      type: z.literal("turnProgress"),
      requestId: requestIdSchema,
      turnId: id,
      event: progressEventSchema,
    })
    .strict(),
  z
    .object({
      type: z.literal("localExec"),
      requestId: requestIdSchema,
      turnId: id,
      request: localExecRequestSchema,
    })
    .strict(),
  /** One provider response's usage in a session turn of this runner (unsolicited; no reply). */
  z
    .object({
      type: z.literal("providerUsage"),
      requestId: requestIdSchema,
      turnId: id,
      usage: providerUsageSchema,
    })
    .strict(),
  /** hostCancel: the runner's process registry cancels a local execution call by its original call and turn ids. */
  z
    .object({
      type: z.literal("localExecCancel"),
      requestId: requestIdSchema,
      callId: requestIdSchema,
      turnId: id,
    })
    .strict(),
]);
export type OutputFrame = z.infer<typeof outputFrameSchema>;
export type OutputFrameOf<T extends OutputFrame["type"]> = Extract<OutputFrame, { type: T }>;
