import { randomUUID } from "node:crypto";
import type { SubagentRun, TranscriptMessage } from "@crw/db";
import { parseDelegatedExecutionScope } from "../scope/index.js";
import { danglingToolCalls, endsWithAnswer } from "./context.js";
import type { DelegationService } from "./service.js";
import { workDirNow } from "./unknownEffect.js";

export interface RecoveryReport {
  readonly discardedForks: readonly string[];
  readonly unknownToolCalls: number;
  readonly continued: readonly string[];
  readonly settledWithoutTurn: readonly string[];
  readonly terminalized: readonly string[];
  readonly failed: readonly string[];
}

export const INTERRUPTED_CONTEXT =
  "Your previous turn was interrupted by a restart. Tool calls whose outcome is unknown are marked as such: " +
  "verify their effect before repeating any of them, then continue the task.";

const UNKNOWN_OUTCOME =
  "interrupted: this call may or may not have taken effect before a restart; its outcome is unknown. " +
  "Verify its effect before repeating it.";

/** How many claimed runs boot recovery works on at once. */
export const RECOVERY_CONCURRENCY = 8;

/**
 * Boot recovery, in order: discard unfinished private fork copies; settle every journal's interrupted tail
 * (provisional rows discarded, each tool call of unknown outcome answered as unknown, never run again);
 * then claim the runs no live process owns. A run that never started is terminalized with an error
 * result; a child whose turn had finished settles without a new turn; any other child continues from its
 * settled journal (an empty one with the original task), and only such an actual continuation dispatch is
 * charged a recovery attempt. A run beyond its attempts gets an ordinary error result that wakes its parent.
 * Last, idle parents with queued results get their follow-up turn.
 */
export async function recoverDelegations(
  service: DelegationService,
  options: { maxRecoveryAttempts?: number; claimBatch?: number; concurrency?: number } = {},
): Promise<RecoveryReport> {
  const repo = service.repo;
  await service.start();
  const discardedForks = await repo.discardPrivateSessions();
  let unknownToolCalls = 0;
  for (const s of await repo.sessionsWithDanglingToolCalls()) {
    await repo.settleProvisional(s.sessionId, s.principalAccountId, "discarded");
    // Only the interrupted tail: the newest turn (getLatestTurn), never the whole journal.
    const dangling = danglingToolCalls(await repo.latestTurn(s.sessionId, s.principalAccountId));
    if (dangling.length === 0) continue;
    unknownToolCalls += dangling.length;
    const answers = [];
    for (const call of dangling)
      answers.push(await unknownOutcome(service, s.sessionId, s.principalAccountId, call));
    await repo.append(
      s.sessionId,
      s.principalAccountId,
      answers.map((message) => ({ body: { type: "message" as const, message } })),
    );
  }

  const continued: string[] = [];
  const settledWithoutTurn: string[] = [];
  const terminalized: string[] = [];
  const failed: string[] = [];
  const max = options.maxRecoveryAttempts ?? 3;
  const runs = await repo.claimOpenRuns(service.owner, options.claimBatch ?? 1000);
  // Claimed runs are independent (one child each, every write in its own transaction), so a few are
  // recovered at a time: one at a time kept the daemon's port closed for minutes with a thousand runs.
  let nextRun = 0;
  const worker = async () => {
    while (nextRun < runs.length) {
      const run = runs[nextRun++] as SubagentRun;
      const action = await recoverRun(service, run, max);
      service.emit({ type: "delegation.recovered", runId: run.id, action });
      ({ continued, settled: settledWithoutTurn, terminalized, failed })[action].push(run.id);
    }
  };
  const width = Math.max(1, Math.min(options.concurrency ?? RECOVERY_CONCURRENCY, runs.length));
  await Promise.all(Array.from({ length: width }, worker));

  for (const s of await repo.sessionsWithQueuedResults()) {
    if (s.kind !== "root") continue;
    const session = await repo.getSession(s.sessionId, s.principalAccountId);
    service.track(service.followUp(session));
  }
  return { discardedForks, unknownToolCalls, continued, settledWithoutTurn, terminalized, failed };
}

async function recoverRun(
  service: DelegationService,
  run: SubagentRun,
  maxAttempts: number,
): Promise<"continued" | "settled" | "terminalized" | "failed"> {
  const repo = service.repo;
  if (run.status === "queued" || !run.childSessionId) {
    // Never started: nothing ran, so nothing is replayed; the parent learns through an ordinary error result.
    await settleError(
      service,
      run,
      run.childSessionId
        ? "the delegated call never started before a restart"
        : "the child session was discarded before it was ready",
    );
    return "terminalized";
  }
  const journal = await repo.readJournal(run.childSessionId, run.principalAccountId);
  const pending =
    (await repo.pendingSteers(run.childSessionId, run.principalAccountId)).length +
    (await repo.queuedResultIds(run.childSessionId, run.principalAccountId)).length;
  if (endsWithAnswer(journal) && pending === 0) {
    // The turn had ended: settle without a new turn and without charging an attempt.
    service.track(service.executeRun(run));
    return "settled";
  }
  if (run.recoveryAttempts >= maxAttempts) {
    await settleError(
      service,
      run,
      `recovery failed after ${run.recoveryAttempts} attempts; verify the child's last step before using DelegateContinue`,
    );
    return "failed";
  }
  const charged = await repo.chargeRecoveryAttempt(run.id, run.generation);
  if (!charged) return "failed";
  const next: SubagentRun = {
    ...run,
    generation: charged.generation,
    recoveryAttempts: charged.recoveryAttempts,
  };
  if (journal.length === 0) {
    // An empty transcript continues with the original task.
    await repo.append(run.childSessionId, run.principalAccountId, [
      { body: { type: "message", message: { role: "user", content: run.task } } },
    ]);
  } else if (!endsWithAnswer(journal)) {
    const context: TranscriptMessage = {
      role: "custom",
      customType: "interrupted",
      content: INTERRUPTED_CONTEXT,
    };
    await repo.append(run.childSessionId, run.principalAccountId, [
      { body: { type: "message", message: context } },
    ]);
  }
  service.track(service.executeRun(next));
  return "continued";
}

async function settleError(service: DelegationService, run: SubagentRun, message: string): Promise<void> {
  const settled = await service.repo.settleRun({
    runId: run.id,
    generation: run.generation,
    resultId: randomUUID(),
    outcome: "error",
    body: message,
    byteSize: Buffer.byteLength(message),
    error: { code: "recovery_failed", message },
  });
  await service.resultQueued(run.parentSessionId, run.principalAccountId, settled.resultId);
}

/**
 * The answer to a tool call whose outcome a crash left unknown. A delegation is verified against its rows
 * (its run either exists and will deliver, or was never recorded); any other tool is reported as unknown
 * and never run again.
 */
async function unknownOutcome(
  service: DelegationService,
  sessionId: string,
  principalAccountId: string,
  call: { id: string; name: string; arguments?: Record<string, unknown> },
): Promise<TranscriptMessage> {
  let content = UNKNOWN_OUTCOME;
  const session = await service.repo.getSession(sessionId, principalAccountId);
  const workDir = session.scope ? parseDelegatedExecutionScope(session.scope).workDir : null;
  content += await workDirNow(workDir, call);
  if (call.name === "Delegate" || call.name === "DelegateContinue") {
    const run = await service.repo.runForToolCall(sessionId, call.id, principalAccountId);
    content = run
      ? `interrupted by a restart: the delegated call ${run.id} was recorded; its result arrives as a message.`
      : "interrupted by a restart before the delegation was recorded: nothing was started. Delegate again if it is still needed.";
  }
  return { role: "toolResult", toolCallId: call.id, toolName: call.name, content, isError: true };
}
