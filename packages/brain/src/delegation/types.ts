import type { DelegationRepository, SessionRow } from "@crw/db";
import type { CatalogPolicy } from "../agent/catalog/index.js";
import type { DelegatedExecutionScope, HostProject } from "../scope/index.js";
import type { DelegationEvent, ResultDeliveredEvent } from "./delivery.js";
import type { ProgressPublisher } from "./progress.js";
import type { MutatingTool } from "./scopedTools.js";
import type { SpillStore } from "./spill.js";
import type { ProgressSink, SessionTurnRunner } from "./turn.js";

export interface DelegationServiceOptions {
  readonly repo: DelegationRepository;
  readonly runner: SessionTurnRunner;
  readonly spill: SpillStore;
  /**
   * The tool catalog policy the session prompts follow: a tool the policy defers is not described in a
   * prompt (it is found through ToolSearch). Defaults to the policy of a runner made by `withToolCatalog`;
   * `null`: every tool is described.
   */
  readonly catalogPolicy?: CatalogPolicy | null;
  /** This process's recovery-owner id (defaults to a fresh one). */
  readonly owner?: string;
  /**
   * The host's inline-byte limit for a result (UTF-8 bytes); may be asynchronous and is awaited for every
   * result. A rejection is a `HostContractError`; the call is not settled (recovery settles it).
   */
  readonly toolResultInlineBytes?: () => number | Promise<number>;
  /**
   * Captures the recipient's output writer for an above-limit result (asynchronous host contract; awaited
   * before anything is written). Default: `spill`. A rejection is a `HostContractError`, nothing settled.
   */
  readonly captureOutputWriter?: (recipient: OutputRecipient) => Promise<SpillStore>;
  /**
   * The host's completion emitter: a background call's prepared result is handed to it and awaited before
   * the result enters the parent's inbox (nothing is delivered before it resolves). A rejection is a
   * `HostContractError`; the call stays open and boot recovery settles it, calling the emitter again.
   */
  readonly completionEmitter?: (completion: BackgroundCompletion) => Promise<void>;
  /** The session's own tools beside Delegate/DelegateContinue/DelegateRead (a child's file and shell tools). */
  readonly tools?: (session: SessionRow) => readonly MutatingTool[];
  /** Overrides the default composition (worker persona for fresh workers, the parent's prompt for forks). */
  readonly systemPrompt?: (session: SessionRow, scope: DelegatedExecutionScope | null) => string;
  readonly onResultDelivered?: (event: ResultDeliveredEvent) => void | Promise<void>;
  readonly onEvent?: (event: DelegationEvent) => void;
  /** Directories of the host no working directory may hold or lie inside (see `assertNotHostPrivate`). */
  readonly hostPrivate?: readonly { readonly path: string; readonly agentsMayUse?: readonly string[] }[];
  /** Where isolated children's git worktrees are made (one directory each); without it, isolation is refused. */
  readonly worktreesDir?: string;
  /**
   * The host's project registry: where a scoped caller's project lives, and which registered project a
   * directory belongs to. Without it, only operators place children (anywhere readable on this host).
   */
  readonly projects?: {
    readonly rootOf?: (ref: string) => Promise<HostProject | undefined> | HostProject | undefined;
    readonly projectForPath?: (dir: string) => Promise<HostProject | undefined> | HostProject | undefined;
    /** Whether a project is granted to an account that is neither the owner nor an administrator. */
    readonly grantedTo?: (accountId: string, ref: string) => Promise<boolean> | boolean;
  };
  /**
   * The host's asynchronous progress publication for each call's snapshots (in order, one at a time). By
   * default a snapshot is stored in the run row's progress columns.
   */
  readonly publishProgress?: ProgressPublisher;
  /**
   * With the default publication (the run row's progress columns): the least time between two writes of a
   * call's progress, 1 s by default (a low-frequency stream: a view that reads it polls no faster); the
   * snapshot still waiting when the call settles is written with its result.
   */
  readonly progressIntervalMs?: number;
  /** Bound of one wait for a child's live helpers; the rows are re-read after each. */
  readonly helperWaitMs?: number;
  /** Bound on follow-up turns in one settlement drain. */
  readonly maxDrainTurns?: number;
  /**
   * The stall watchdog of a foreground call: once its child has shown no progress (text, a tool, a
   * compaction; its result turns' included) for this long, the caller is let go as Ctrl+B lets it go (its
   * Delegate answers "started"; the result comes through the inbox). Default 10 minutes; 0 turns it off.
   */
  readonly stallAfterMs?: number;
}

/** Whose inbox an above-limit result is written for. */
export interface OutputRecipient {
  readonly sessionId: string;
  readonly principalAccountId: string;
}

/** What the completion emitter receives for a background call, before its inbox handoff. */
export interface BackgroundCompletion {
  readonly runId: string;
  readonly resultId: string;
  readonly parentSessionId: string;
  readonly childSessionId: string | null;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly outcome: "ok" | "error";
  /** The prepared body: inline, or the bounded placeholder of a spilled result. */
  readonly body: string;
  readonly byteSize: number;
}

export interface DelegateArgs {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly task: string;
  readonly mode: "foreground" | "background";
  /** The caller's turn is read-only (plan mode): the child is read-only too. */
  readonly callerReadOnly?: boolean;
  readonly role?: string;
  readonly context?: string;
  readonly tools?: { readonly allow?: readonly string[]; readonly deny?: readonly string[] };
  readonly readOnly?: boolean;
  readonly workDir?: string | null;
  /** `worktree`: the child works in a git worktree of its own, on a branch crw commits to when it settles. */
  readonly isolation?: "none" | "worktree";
  readonly model?: string;
  /** A fork: the child continues the parent's transcript and prompt instead of a fresh worker's. */
  readonly fork?: boolean;
  readonly progress?: ProgressSink;
}

/** What the host names when it starts a memory-dreaming run (never model or plugin input). */
export interface DreamArgs {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  /** The host's dream run id: minted into the scope's marker and the call's id. */
  readonly dreamRunId: string;
  readonly task: string;
  readonly model?: string;
  /** The host-imposed boundary (default read-only). */
  readonly permissionBoundary?: "read-only" | "workspace-write" | "full-access";
  readonly tools?: { readonly allow?: readonly string[]; readonly deny?: readonly string[] };
  readonly progress?: ProgressSink;
}

export interface ContinueArgs {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly childSessionId: string;
  readonly toolCallId: string;
  readonly text: string;
  readonly mode: "foreground" | "background";
  readonly callerReadOnly?: boolean;
  /** Asks for write access; refused from a read-only turn. */
  readonly writeAccess?: boolean;
  /** The continuation's onEvent: session and progress events of this call (after admission only). */
  readonly progress?: ProgressSink;
  /**
   * The model this continuation runs on. It belongs to this call (stored on its row, replayed by its
   * recovery); the child session keeps its own model for later continuations.
   */
  readonly model?: string;
  /**
   * Promote the child: its durable scope is minted again from the caller's live access (placement, role
   * and context kept; old tool restrictions and read-only dropped). Refused from a read-only turn.
   */
  readonly promote?: boolean;
}

/** What a completion emitter accepts: a sub-agent's result, or one whole-workflow summary. */
export type DelegationCompletion =
  | {
      readonly kind: "subagent";
      readonly runId: string;
      readonly principalAccountId: string;
      readonly outcome: "ok" | "error";
      readonly body: string;
    }
  | {
      readonly kind: "workflow_summary";
      readonly parentSessionId: string;
      readonly principalAccountId: string;
      readonly toolCallId: string;
      readonly outcome: "ok" | "error";
      readonly summary: string;
    };

export type DelegationReceipt =
  | {
      readonly kind: "result";
      readonly runId: string;
      readonly childSessionId: string;
      readonly resultId: string;
      readonly outcome: "ok" | "error";
      readonly body: string;
    }
  | {
      readonly kind: "started";
      readonly runId: string;
      readonly childSessionId: string;
      /** A foreground call its stall watchdog moved to the background: the silence it saw (ms). */
      readonly stalledMs?: number;
    }
  | { readonly kind: "steered"; readonly childSessionId: string; readonly steerId: string };

/**
 * The outcome of draining a settling child's pending results and steers into a follow-up turn. `failed`
 * carries the first delivered result id, the reason and the original cause (in memory only; the persisted
 * result payloads stay as they were); `aborted` takes precedence over failure.
 */
export type PendingResultDrainOutcome =
  | { readonly kind: "idle" }
  | { readonly kind: "delivered"; readonly resultIds: readonly string[]; readonly reply: string | undefined }
  | {
      readonly kind: "failed";
      readonly resultId: string | undefined;
      readonly reason: string;
      readonly cause: Error;
    }
  | { readonly kind: "aborted" };
