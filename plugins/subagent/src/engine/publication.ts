import { WorkflowStateError } from "../errors.js";
import type { NodeStatus } from "../journal/schema.js";
import type { PgWorkflowStore, WorkflowRecovery, WorkflowStatus } from "../store/native.js";

/** An immutable progress snapshot of one workflow, as clients and the native record see it. */
export interface WorkflowSnapshot {
  readonly workflowId: string;
  readonly name: string;
  readonly status: WorkflowStatus;
  readonly run: number;
  /** The origin's waiter let go (Ctrl+B): the summary arrives as a message instead of the tool's result. */
  readonly background?: true;
  readonly nodes: readonly {
    readonly id: string;
    readonly status: NodeStatus;
    readonly childSessionId?: string;
    readonly error?: string;
  }[];
}

export interface WorkflowUpdate {
  readonly workflowId: string;
  readonly status: WorkflowStatus;
  readonly snapshot: WorkflowSnapshot;
  /**
   * The writer's row lease: a later write is accepted only while this owner holds the row (besides the
   * expected generation). Absent: fenced by the generation alone.
   */
  readonly owner?: string;
  /** Only for the initial native insert. */
  readonly create?: {
    readonly parentSessionId: string;
    readonly principalAccountId: string;
    readonly toolCallId: string;
    readonly owner: string;
  };
}

export type WorkflowEmitResult =
  | { readonly status: "created"; readonly recovery: WorkflowRecovery; readonly workflowId: string }
  | { readonly status: "updated" }
  | { readonly status: "stale" };

/**
 * The awaited publication contract: only the initial native insert omits `expectedGeneration` (and must
 * come back `created` with its recovery proof); every later write names the generation it was queued under
 * and comes back `updated` or, refused, `stale` (nothing published). Boot recovery emits through the same
 * contract.
 */
export type WorkflowEmitter = (
  update: WorkflowUpdate,
  expectedGeneration?: number,
) => Promise<WorkflowEmitResult>;

/**
 * The host's emitter over the native record. `forward` (owner and channel forwarding to live clients) is
 * awaited after an accepted write and sees the same result the engine gets; a stale write forwards nothing.
 */
export function pgWorkflowEmitter(
  store: PgWorkflowStore,
  forward?: (update: WorkflowUpdate, result: WorkflowEmitResult) => Promise<void> | void,
): WorkflowEmitter {
  return async (update, expectedGeneration) => {
    let result: WorkflowEmitResult;
    if (expectedGeneration === undefined) {
      if (!update.create) throw new TypeError("the initial workflow publication needs its identity");
      const inserted = await store.insertWorkflow({
        id: update.workflowId,
        ...update.create,
        name: update.snapshot.name,
        snapshot: update.snapshot,
      });
      const recovery = await store.recoverableWorkflow(inserted.id);
      if (!recovery) {
        throw new WorkflowStateError("missing_recovery_proof", "the created workflow has no recovery proof", {
          workflowId: inserted.id,
        });
      }
      result = { status: "created", recovery, workflowId: inserted.id };
    } else {
      result = {
        status: await store.publishSnapshot(
          update.workflowId,
          update.snapshot,
          update.status,
          expectedGeneration,
          update.owner,
        ),
      };
    }
    if (result.status !== "stale") await forward?.(update, result);
    return result;
  };
}

/** A queued publication that has not been handed to the emitter yet. */
interface Pending {
  update: WorkflowUpdate;
  readonly expectedGeneration: number | undefined;
  readonly result: Promise<WorkflowEmitResult>;
}

/**
 * One workflow's serialized publication: each snapshot is captured (deep-frozen) and its expected
 * generation read when it is queued, then written strictly in queue order. A running snapshot queued
 * behind another running one that has not started yet, under the same fence, replaces it: the newer
 * snapshot holds everything the older one showed, both callers get the one write's result, and parallel
 * nodes share a commit instead of queueing one each.
 */
export class SnapshotPublisher {
  #tail: Promise<unknown> = Promise.resolve();
  #pending: Pending | undefined;

  constructor(private readonly emit: WorkflowEmitter) {}

  /**
   * `handedOver`: the caller built `update` for this call and keeps no reference to it, so it is frozen
   * as it is instead of being copied first.
   */
  queue(
    update: WorkflowUpdate,
    expectedGeneration: number | undefined,
    handedOver = false,
  ): Promise<WorkflowEmitResult> {
    const frozen = deepFreeze(handedOver ? update : structuredClone(update));
    const pending = this.#pending;
    if (pending && replaces(pending, frozen, expectedGeneration)) {
      pending.update = frozen;
      return pending.result;
    }
    const write = () => {
      if (this.#pending === entry) this.#pending = undefined;
      return this.emit(entry.update, expectedGeneration);
    };
    const entry: Pending = { update: frozen, expectedGeneration, result: this.#tail.then(write, write) };
    this.#pending = entry;
    this.#tail = entry.result.catch(() => undefined);
    return entry.result;
  }

  /** Resolves when everything queued so far has settled (successfully or not). */
  drain(): Promise<void> {
    return this.#tail.then(() => undefined);
  }
}

/** Only a running snapshot under the same fence (generation and lease) supersedes a queued one. */
function replaces(pending: Pending, update: WorkflowUpdate, expectedGeneration: number | undefined): boolean {
  const queued = pending.update;
  return (
    expectedGeneration !== undefined &&
    pending.expectedGeneration === expectedGeneration &&
    queued.create === undefined &&
    update.create === undefined &&
    queued.status === "running" &&
    update.status === "running" &&
    queued.workflowId === update.workflowId &&
    queued.owner === update.owner
  );
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
