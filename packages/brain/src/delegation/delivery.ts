import type { DelegationRepository, DeliveredResult, QueuedResult, TranscriptMessage } from "@crw/db";
import { faultPoint } from "./faults.js";
import type { Notifier } from "./notifier.js";

/** The parent-facing message of a delivered result; carries details.resultId, the proof of delivery. */
export function resultMessage(result: QueuedResult): TranscriptMessage {
  const head =
    result.kind === "workflow_summary"
      ? `[workflow summary for call ${result.toolCallId}: ${result.outcome}]`
      : `[delegation result for call ${result.toolCallId} from child ${result.childSessionId ?? "(discarded)"}: ${result.outcome}]`;
  return {
    role: "custom",
    customType: "delegation_result",
    content: `${head}\n${result.body}`,
    details: {
      resultId: result.id,
      ...(result.childSessionId ? { childSessionId: result.childSessionId } : {}),
      ...(result.runId ? { runId: result.runId } : {}),
      outcome: result.outcome,
      byteSize: result.byteSize,
      ...(result.spillPath ? { spillPath: result.spillPath } : {}),
    },
  };
}

export interface ResultDeliveredEvent {
  readonly parentSessionId: string;
  readonly delivered: readonly DeliveredResult[];
}

/** Typed events of the delegation core; apps turn them into logs. */
export type DelegationEvent =
  | {
      readonly type: "delegation.result_steered";
      readonly parentSessionId: string;
      readonly resultId: string;
    }
  | {
      readonly type: "delegation.result_delivered";
      readonly parentSessionId: string;
      readonly resultIds: readonly string[];
    }
  | {
      readonly type: "delegation.recovered";
      readonly runId: string;
      readonly action: string;
      /** Why a live takeover handed the run back (action `handed_back`). */
      readonly error?: string;
    }
  | { readonly type: "delegation.publish_failed"; readonly parentSessionId: string; readonly error: string }
  /** A call's progress snapshot (or Ctrl+B's background write) was not published; the call goes on. */
  | {
      readonly type: "delegation.progress_failed";
      readonly runId: string;
      readonly seq: number;
      readonly code: string;
      readonly error: string;
    }
  /** A foreground call's child showed no progress for `silentMs`: its caller was let go (`moved`) or not. */
  | {
      readonly type: "delegation.stalled";
      readonly runId: string;
      readonly silentMs: number;
      readonly moved: boolean;
      readonly error?: string;
    }
  /** The restart checkpoint drained this process's captured writes (`failures` of them failed). */
  | { readonly type: "delegation.paused"; readonly failures: number }
  /** Background work (a call, a follow-up turn) failed outside any caller; its rows stay for recovery. */
  | { readonly type: "delegation.background_failed"; readonly error: string; readonly code?: string };

export interface DeliveryDeps {
  readonly repo: DelegationRepository;
  readonly notifier: Notifier;
  readonly onResultDelivered?: (event: ResultDeliveredEvent) => void | Promise<void>;
  readonly emit: (event: DelegationEvent) => void;
}

/** A result moved into its recipient's journal, and the row that carries it. */
export interface Delivered {
  readonly result: QueuedResult;
  readonly delivered: DeliveredResult;
}

/**
 * Moves a session's queued results into its journal: one transaction appends each result's message and
 * acknowledges it, in FIFO order; after the commit `onResultDelivered` publishes. A failure to publish is
 * reported and never undoes, or repeats, the delivery.
 */
export async function drainResults(
  deps: DeliveryDeps,
  sessionId: string,
  principalAccountId: string,
): Promise<TranscriptMessage[]> {
  return (await deliverQueued(deps, sessionId, principalAccountId)).map((d) => resultMessage(d.result));
}

/** `drainResults`, answering with each delivered result and its journal row. */
export async function deliverQueued(
  deps: DeliveryDeps,
  sessionId: string,
  principalAccountId: string,
  options: { readonly limit?: number; readonly only?: readonly string[] } = {},
): Promise<Delivered[]> {
  const probe = {
    probe: (point: string) => (point === "delivery.between_append_and_ack" ? faultPoint(point) : undefined),
  };
  let delivered: readonly DeliveredResult[];
  let results: readonly QueuedResult[];
  if (options.only) {
    // Chosen results: those of them still waiting, in queue order.
    const waiting = await deps.repo.queuedResults(sessionId, principalAccountId);
    results = waiting.filter((q) => options.only?.includes(q.id));
    if (results.length === 0) return [];
    const out = await deps.repo.deliverResults(
      sessionId,
      principalAccountId,
      results.map((q) => q.id),
      resultMessage,
      probe,
    );
    delivered = out.delivered;
  } else {
    // Whatever waits, read under the session's lock by the delivery itself.
    ({ delivered, results } = await deps.repo.deliverQueuedResults(
      sessionId,
      principalAccountId,
      resultMessage,
      {
        ...probe,
        ...(options.limit !== undefined ? { limit: options.limit } : {}),
      },
    ));
  }
  if (delivered.length === 0) return [];
  faultPoint("delivery.after_commit");
  deps.emit({
    type: "delegation.result_delivered",
    parentSessionId: sessionId,
    resultIds: delivered.map((d) => d.resultId),
  });
  if (deps.onResultDelivered) {
    try {
      await deps.onResultDelivered({ parentSessionId: sessionId, delivered });
    } catch (e) {
      deps.emit({
        type: "delegation.publish_failed",
        parentSessionId: sessionId,
        error: e instanceof Error ? e.message : String(e),
      });
    }
  }
  const byId = new Map(results.map((q) => [q.id, q]));
  return delivered.map((d) => ({ result: byId.get(d.resultId) as QueuedResult, delivered: d }));
}
