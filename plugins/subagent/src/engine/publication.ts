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

/**
 * One workflow's serialized publication: each snapshot is captured (deep-frozen) and its expected
 * generation read when it is queued, then written strictly in queue order.
 */
export class SnapshotPublisher {
  #tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly emit: WorkflowEmitter) {}

  queue(update: WorkflowUpdate, expectedGeneration: number | undefined): Promise<WorkflowEmitResult> {
    const frozen = deepFreeze(structuredClone(update));
    const next = this.#tail.then(
      () => this.emit(frozen, expectedGeneration),
      () => this.emit(frozen, expectedGeneration),
    );
    this.#tail = next.catch(() => undefined);
    return next;
  }

  /** Resolves when everything queued so far has settled (successfully or not). */
  drain(): Promise<void> {
    return this.#tail.then(() => undefined);
  }
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
