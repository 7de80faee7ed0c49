import type { HostThread, SessionHost } from "../host/sessionHost.js";
import type { JournalWriter } from "../journal/journal.js";
import type { JournalRow, NewRow, Pair, Tokens } from "../journal/rows.js";
import type { RunPaths } from "../run/paths.js";
import type { RoleName, RoleTable } from "../run/roles.js";
import type { RunSpec } from "../run/spec.js";
import type { FileStepBus } from "../steps/stepBus.js";
import type { HostHealth } from "./hostHealth.js";
import type { RefusalBound } from "./refusals.js";
import type { CallTracer } from "./trace.js";

/** Typed events a run emits; the CLI turns them into its log lines. */
export type FlowEvent =
  | { type: "step_published"; call: string; marker: string; action: string }
  | { type: "bound"; call: string; marker: string; agent: string; via: "report" | "lookup" | "adopt" }
  | { type: "reply"; name: string; reply: string; reason: string }
  | { type: "call_ended"; call: string; status: string }
  | { type: "attempt_lost"; call: string; attempt: number; reason: string }
  | { type: "stopping"; reason: string }
  | { type: "warning"; message: string };

/** Everything one run process shares between its calls. The journal's rows are the run's only truth. */
export interface RunContext {
  readonly runId: string;
  readonly owner: string;
  readonly paths: RunPaths;
  readonly spec: RunSpec;
  readonly table: RoleTable;
  /** The pairs this process runs on (its started row's role_pairs). */
  readonly pins: Record<RoleName, Pair>;
  readonly host: SessionHost;
  readonly bus: FileStepBus;
  readonly journal: JournalWriter;
  readonly pollMs: number;
  readonly lostAfterMs: number;
  /** How often a waiting step is looked up on the host by its marker (the fallback to a report). */
  readonly lookupEveryMs: number;
  /** The reason the run is stopping (a pause, a held call, a fatal error), or null while it runs. */
  stopping: { reason: string } | null;
  /** The bound on an owner's repeated refusals of one step (session runs). */
  readonly refusals?: RefusalBound;
  /** Whether the owner's host answers (session runs): past a bound of failures, why and what to do. */
  readonly hostHealth?: HostHealth;
  /** SessionConfig.Trace: digests at bind and harvest (null when the run does not trace). */
  readonly tracer?: CallTracer | null;
  append(rows: NewRow[]): JournalRow[];
  /** The same batch with its fdatasync off the event loop (shared with batches written meanwhile). */
  appendDurable(rows: NewRow[]): Promise<JournalRow[]>;
  rowsOf(call: string): readonly JournalRow[];
  /** A subagent thread's whole count at the newest harvest of another call than `call` (durable rows). */
  threadCountBefore(threadId: string, call: string): Tokens | undefined;
  stop(reason: string): void;
  /** Aborted when the run stops: a turn this process runs itself (the local backend's) ends with it. */
  readonly stopSignal?: AbortSignal;
  emit(event: FlowEvent): void;
  /** The unanswered report names of the inbox, read again only after it changed (or a poll interval). */
  unanswered(): string[];
  /**
   * One poll interval, cut short when the inbox changed past `since` (read with `inboxVersion` before the
   * caller listed it; without it, a change from now on) or the run stops.
   */
  nap(since?: number): Promise<void>;
  inboxVersion(): number;
  /** Report `name` was answered (its reply is on disk): not listed as unanswered from now on. */
  answered(name: string): void;
  /** The count of the host's notifications that changed a thread: read before the thread is read. */
  hostVersion(threadId: string): number;
  /** Until the host notifies a change of the thread past `since`, the run stops, or one poll interval. */
  hostNap(threadId: string, since: number): Promise<void>;
  /** The owner's subagents whose spawn message carries the marker (from the owner's spawnAgent items). */
  spawnedFor(
    marker: string,
  ): Promise<{ ok: true; value: HostThread[] } | { ok: false; reason: string; message: string }>;
}

/** Thrown into the workflow by a call of a run that is stopping; the run process then exits. */
export class RunStopped extends Error {
  override readonly name = "RunStopped";
  constructor(readonly reason: string) {
    super(`the run is stopping: ${reason}`);
  }
}
