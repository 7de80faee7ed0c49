import { z } from "zod";
import { hostRpcMethodSchema } from "./hostRpcMethods.js";

/**
 * The turn contract between the daemon and whatever runs a delegated child's turn (a runner process or the
 * daemon itself). A request names the child session, its parent channel (the fairness and abort key) and the
 * prompt; the answer is the child's settled reply. `script` drives the offline scripted provider: each step
 * happens in order, so tests and benchmarks get deterministic turns with real side effects.
 */
export const scriptedStepSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("text"), text: z.string().max(65_536) }).strict(),
  z.object({ kind: z.literal("reasoning"), text: z.string().max(65_536) }).strict(),
  z
    .object({
      kind: z.literal("tool"),
      name: z.string().min(1).max(128),
      args: z.record(z.string(), z.unknown()).optional(),
      result: z.string().max(65_536).optional(),
    })
    .strict(),
  /** A bounded pause; an abort ends it early. */
  z.object({ kind: z.literal("wait"), ms: z.number().int().min(0).max(600_000) }).strict(),
  z
    .object({
      kind: z.literal("hostRpc"),
      method: hostRpcMethodSchema,
      params: z.unknown(),
    })
    .strict(),
  /** Start a process for the turn (it may outlive the turn; the runner contains it). */
  z
    .object({ kind: z.literal("spawn"), command: z.array(z.string().min(1).max(4096)).min(1).max(256) })
    .strict(),
  /** Local execution through the daemon; a service returns once started, anything else once it exits. */
  z
    .object({
      kind: z.literal("localExec"),
      command: z.array(z.string().min(1).max(4096)).min(1).max(256),
      service: z.boolean(),
    })
    .strict(),
  /** Cancel every background service this runner admitted (its process registry). */
  z.object({ kind: z.literal("stopServices") }).strict(),
  /** A real, durable side effect (appended and fsynced) so tests can count executions. */
  z
    .object({ kind: z.literal("appendFile"), path: z.string().min(1).max(4096), line: z.string().max(4096) })
    .strict(),
  z
    .object({
      kind: z.literal("fail"),
      message: z.string().max(4096),
      code: z.string().min(1).max(128).optional(),
    })
    .strict(),
]);
export type ScriptedStep = z.infer<typeof scriptedStepSchema>;

const idSchema = z.string().min(1).max(128);

export const delegatedTurnRequestSchema = z
  .object({
    turnId: idSchema,
    /** The parent's channel: producer key of the fair queue and the unit of abort. */
    channelId: idSchema,
    sessionId: idSchema,
    /** Set for nested delegation: the parent is itself a sub-agent session. */
    parentSessionId: idSchema.optional(),
    accountId: idSchema.optional(),
    model: z.string().min(1).max(256).optional(),
    prompt: z.string().max(1_000_000),
    script: z.array(scriptedStepSchema).max(10_000).optional(),
  })
  .strict();
export type DelegatedTurnRequest = z.infer<typeof delegatedTurnRequestSchema>;

export const delegatedTurnResultSchema = z
  .object({
    turnId: idSchema,
    sessionId: idSchema,
    text: z.string(),
    stopReason: z.enum(["end", "aborted"]),
  })
  .strict();
export type DelegatedTurnResult = z.infer<typeof delegatedTurnResultSchema>;

/** Events a live view (tap) sees; the parent's own progress stream stays the narrow `progress` frame. */
export const tapEventSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("text"), turnId: idSchema, text: z.string() }).strict(),
  z.object({ kind: z.literal("reasoning"), turnId: idSchema, text: z.string() }).strict(),
  z
    .object({
      kind: z.literal("tool"),
      turnId: idSchema,
      name: z.string().min(1).max(128),
      phase: z.enum(["start", "end"]),
      result: z.string().optional(),
    })
    .strict(),
]);
export type TapEvent = z.infer<typeof tapEventSchema>;

/** One durable history entry of a child, as a tap snapshot shows it. `id` is the paging cursor. */
export const historyEntrySchema = z
  .object({
    id: z.string().min(1).max(128),
    role: z.enum(["user", "assistant", "tool"]),
    text: z.string(),
  })
  .strict();
export type HistoryEntry = z.infer<typeof historyEntrySchema>;

/** history.before: a cursor of 1 to 128 characters naming the entry the page ends before. */
export const tapCursorSchema = z.string().min(1).max(128);

export const tapSnapshotSchema = z
  .object({
    sessionId: idSchema,
    model: z.string().nullable(),
    history: z.array(historyEntrySchema),
    /** Events of the turn in flight so far, replayed before live events. */
    live: z.array(tapEventSchema),
    /**
     * Where the child is executing, resolved only under the dispatched turn's own authority
     * (includeExecution: true). Views never carry it: the daemon merges the child's location itself.
     */
    execution: z.object({ turnId: idSchema }).strict().optional(),
  })
  .strict();
export type TapSnapshot = z.infer<typeof tapSnapshotSchema>;
