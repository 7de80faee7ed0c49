import { z } from "zod";
import { WorkflowNodeSchema } from "../definition/schema.js";

/**
 * A node's state in the orchestration journal:
 *
 *   pending ──reserve──▶ reserved ──child created──▶ running ──answer──▶ succeeded
 *      │                    │                          ├──error──▶ failed
 *      │ (cancel)           │ (cancel)                 └──cancel──▶ interrupted
 *      ▼                    ▼
 *   cancelled            cancelled
 *   blocked: a dependency ended without success; the node never starts.
 *
 * `reserved` is journaled (and snapshotted) before any asynchronous access, model or artifact preparation,
 * and charges the dispatch budget once; `running` names the planned child session, so recovery continues
 * that child and never launches a second one.
 */
export const NODE_STATUSES = [
  "pending",
  "reserved",
  "running",
  "succeeded",
  "failed",
  "cancelled",
  "interrupted",
  "blocked",
] as const;
export type NodeStatus = (typeof NODE_STATUSES)[number];
export const TERMINAL_NODE_STATUSES: ReadonlySet<NodeStatus> = new Set([
  "succeeded",
  "failed",
  "cancelled",
  "interrupted",
  "blocked",
]);

const uuid = z.uuid();
const ERROR_CODE_MAX = 100;
const ERROR_MESSAGE_MAX = 4000;
const errorShape = z.strictObject({
  code: z.string().min(1).max(ERROR_CODE_MAX),
  message: z.string().max(ERROR_MESSAGE_MAX),
});

/**
 * A node's error as its journal holds it: a host's code or a provider's message can be longer than a row may
 * be, and a journal that breaks its own schema can no longer be read for a resume.
 */
export function journaledError(code: string, message: string): { code: string; message: string } {
  return {
    code: code.slice(0, ERROR_CODE_MAX) || "node_error",
    message: message.slice(0, ERROR_MESSAGE_MAX),
  };
}

export const NodeStateSchema = z.strictObject({
  spec: WorkflowNodeSchema,
  status: z.enum(NODE_STATUSES),
  /** The node whose WorkflowAddNodes call added this one; absent for definition nodes. */
  addedBy: z.string().optional(),
  childSessionId: uuid.optional(),
  /**
   * The child session id chosen at reservation, journaled before the child row is inserted: a process
   * killed between that insert and the journal write that places the child finds and adopts the same
   * (empty) row at boot instead of leaving it behind and creating another.
   */
  plannedChildId: uuid.optional(),
  /** The run number under which the node was last reserved. */
  run: z.number().int().positive().optional(),
  /** A short handover for direct dependents, recorded for every completed node. */
  handover: z.string().max(4000).optional(),
  /** The shared result artifact (its content hash) of a succeeded node. */
  artifact: z
    .strictObject({ sha256: z.string().regex(/^[0-9a-f]{64}$/), byteSize: z.number().int().nonnegative() })
    .optional(),
  error: errorShape.optional(),
});
export type NodeState = z.infer<typeof NodeStateSchema>;

/** The origin turn's access, as captured on start and again on an explicit resume. */
export const OriginAccessSchema = z.strictObject({
  accountId: uuid,
  operator: z.boolean(),
  target: z.unknown(),
  projectRef: z.string().nullable(),
  tools: z.strictObject({ allow: z.array(z.string()).optional(), deny: z.array(z.string()) }),
  permissionBoundary: z.enum(["read-only", "workspace-write", "full-access"]),
  readOnly: z.boolean(),
});
export type OriginAccess = z.infer<typeof OriginAccessSchema>;

/**
 * The version-2 orchestration journal: one JSON document per workflow, written under the workflow's lease
 * (stored as a header and a row per node: see store/journalLayout.ts). Recovery requires exactly this
 * shape; anything else takes the invalid-journal path.
 */
export const OrchestrationJournalSchema = z.strictObject({
  version: z.literal(2),
  workflowId: uuid,
  name: z.string(),
  parentSessionId: uuid,
  principalAccountId: uuid,
  toolCallId: z.string(),
  /** The native record's recovery metadata, adopted from the host's created receipt (or at boot). */
  recovery: z.strictObject({
    workflowGeneration: z.number().int().positive(),
    recoveryAdmissionVersion: z.number().int().positive(),
  }),
  /** 1 on start; an explicit WorkflowResume starts run + 1. */
  run: z.number().int().positive(),
  definition: z.strictObject({
    path: z.string().nullable(),
    version: z.string(),
    maxDispatches: z.number().int().positive(),
  }),
  origin: z.strictObject({ access: OriginAccessSchema, cwd: z.string().nullable() }),
  order: z.array(z.string()),
  nodes: z.record(z.string(), NodeStateSchema),
  /** Per node: the canonical DelegatedExecutionScope its child was (or will be) created with. */
  nodeAccess: z.record(z.string(), z.string()),
  /** Per isolated node: its git worktree and branch (made before its child, reused after a crash). */
  nodeWorktrees: z
    .record(
      z.string(),
      z.strictObject({
        repoRoot: z.string(),
        path: z.string(),
        branch: z.string(),
        baseCommit: z.string(),
        startedFromBranch: z.string().nullable(),
      }),
    )
    .optional(),
  /** Per node: the model its child runs on. */
  nodeModels: z.record(z.string(), z.string()),
  /** Per agent type: the model pinned for every node of that type in this workflow. */
  typeModelPins: z.record(z.string(), z.string()),
  /** Fresh dispatches charged so far (recovery continuations charge nothing). */
  dispatches: z.number().int().nonnegative(),
  cancelRequested: z.boolean(),
  /** The whole-workflow summary's result id, fixed up front so its delivery is exactly once. */
  summaryResultId: uuid,
  /** The tool call the summary answers when it is not the starting one (an explicit WorkflowResume's). */
  summaryToolCallId: z.string().min(1).max(200).optional(),
  /** How nodes may add nodes: in process, through the runner RPC, or not at all (absent: in process). */
  expansion: z.enum(["local", "rpc", "none"]).optional(),
});
export type OrchestrationJournal = z.infer<typeof OrchestrationJournalSchema>;

export type JournalReading =
  | { readonly ok: true; readonly journal: OrchestrationJournal }
  | { readonly ok: false; readonly reason: string };

/** Decodes a stored journal; an old format (or a malformed document) is an explicit, reportable refusal. */
export function readOrchestrationJournal(raw: unknown): JournalReading {
  const version =
    typeof raw === "object" && raw !== null ? (raw as { version?: unknown }).version : undefined;
  if (version !== 2) {
    return {
      ok: false,
      reason: `orchestration journal has format ${JSON.stringify(version ?? null)}; recovery requires format 2`,
    };
  }
  const parsed = OrchestrationJournalSchema.safeParse(raw);
  if (!parsed.success) {
    const first = parsed.error.issues[0];
    return {
      ok: false,
      reason: `orchestration journal is malformed at ${first?.path.join(".") || "(root)"}: ${first?.message ?? "invalid"}`,
    };
  }
  return { ok: true, journal: parsed.data };
}
