import type { SessionRow } from "@crw/db";
import { type Delivered, deliverQueued } from "./delivery.js";
import { DelegationError } from "./errors.js";
import type { DelegationService } from "./service.js";

/**
 * Client-driven root sessions: an outside agent (an MCP client such as Codex or Claude Code) is the
 * session's model. It delegates through crw, and the results delivered to its session wait in the inbox
 * until it takes them: taking one is the same append-and-acknowledge delivery a model parent gets, so a
 * result is taken once, and one not yet taken survives any restart.
 */

/**
 * Bound of one wait between takes without `news`: this process's settlements wake the wait, another
 * process's only this bound.
 */
const TAKE_RECHECK_MS = 500;

/**
 * What wakes a take waiting for the next result, opened before the first take so that a result queued
 * between a take and the wait is not missed: the daemon's hears every process's settlements.
 */
export interface ResultNews {
  /** Resolves at news since the previous call, at its own bound, at `maxMs`, or on abort. */
  wait(signal: AbortSignal | undefined, maxMs: number): Promise<unknown>;
}

/** The account's client session named `name`, placed in `cwd` when it is made (a found one keeps its own). */
export async function openClientSession(
  service: DelegationService,
  principalAccountId: string,
  name: string,
  model: string,
  options: { cwd?: string } = {},
): Promise<{ session: SessionRow; created: boolean }> {
  const scope = options.cwd ? await service.rootScopeFor(principalAccountId, options.cwd) : undefined;
  return service.repo.openClientSession(principalAccountId, name, model, scope);
}

export function assertClientDriven(session: SessionRow): void {
  if (session.driver !== "client" || session.kind !== "root") {
    throw new DelegationError(
      "invalid_input",
      "only a client-driven session's results are taken by its client",
      {
        sessionId: session.id,
      },
    );
  }
}

/**
 * Takes the session's queued results (or only those of `only` still queued), oldest first; with none
 * waiting, waits up to `waitMs` for the next one.
 * What it answers is acknowledged before it answers (a client that loses the answer reads it again with
 * `takenResults`).
 */
export async function takeResults(
  service: DelegationService,
  session: SessionRow,
  options: {
    waitMs?: number;
    limit?: number;
    only?: readonly string[];
    signal?: AbortSignal;
    news?: ResultNews;
  } = {},
): Promise<Delivered[]> {
  assertClientDriven(session);
  const deadline = Date.now() + (options.waitMs ?? 0);
  for (;;) {
    // A caller gone (its connection closed) takes nothing more: a result taken now would reach nobody.
    if (options.signal?.aborted) return [];
    const taken = await service.writes.capture(
      "a client's take of its results",
      () =>
        deliverQueued(service.deliveryDeps(), session.id, session.principalAccountId, {
          ...(options.limit !== undefined && { limit: options.limit }),
          ...(options.only && { only: options.only }),
        }),
      session.id,
    );
    const left = deadline - Date.now();
    if (taken.length > 0 || left <= 0 || options.signal?.aborted) return taken;
    if (options.news) await options.news.wait(options.signal, left);
    else await service.notifier.wait(session.id, Math.min(TAKE_RECHECK_MS, left));
  }
}
