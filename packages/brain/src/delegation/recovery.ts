import { randomUUID } from "node:crypto";
import type {
  JournalDelta,
  JournalEntry,
  JournalWrite,
  SessionRow,
  SubagentRun,
  TranscriptMessage,
} from "@crw/db";
import { type DelegationAuthority, parseDelegatedExecutionScope } from "../scope/index.js";
import { danglingToolCalls, endsWithAnswer } from "./context.js";
import { DelegationError, toError } from "./errors.js";
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

/** How many claimed runs boot recovery decides together (two statements a batch), then starts. */
const RECOVERY_BATCH = 64;
/** The first batch is small: the first continued turn does not wait for a whole batch. */
const FIRST_BATCH = 8;

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
  options: { maxRecoveryAttempts?: number; claimBatch?: number; batch?: number } = {},
): Promise<RecoveryReport> {
  const repo = service.repo;
  await service.start();
  const discardedForks = await repo.discardPrivateSessions();
  const unknownToolCalls = await settleInterruptedTails(service);

  const runs = await repo.claimOpenRuns(service.owner, options.claimBatch ?? 1000);
  const outcome = await recoverRuns(service, runs, options);

  for (const s of await repo.sessionsWithQueuedResults()) {
    if (s.kind !== "root") continue;
    const session = await repo.getSession(s.sessionId, s.principalAccountId);
    service.track(service.followUp(session));
  }
  return { discardedForks, unknownToolCalls, ...outcome };
}

/**
 * Live takeover: the boot pass for the work of owners that died while this process runs. Only runs leased
 * by a dead owner are claimed (same claim, `deadOwnersOnly`); a live process's runs, and runs nobody has
 * leased yet, are left alone. The interrupted tails settled are those of the claimed children and of
 * their root parents that no turn of this process holds (boot settles every journal: here the other
 * journals may belong to live processes). Then each run is recovered exactly as at boot, and the root
 * parents with queued results get their follow-up turn here, as after a boot. A run this process already
 * drives is never started a second time. What cannot be recovered now (a lost connection, say) is handed
 * back to the next sweep rather than left leased by this live process, where no one would take it.
 */
export async function takeOverDelegations(
  service: DelegationService,
  options: { maxRecoveryAttempts?: number; claimBatch?: number; batch?: number } = {},
): Promise<RecoveryReport & { roots: readonly string[]; handedBack: readonly string[] }> {
  const repo = service.repo;
  const nothing = { discardedForks: [], unknownToolCalls: 0, roots: [], handedBack: [], ...noRuns() };
  if (service.paused) return nothing;
  const claimed = await repo.claimOpenRuns(service.owner, options.claimBatch ?? 1000, {
    deadOwnersOnly: true,
  });
  let runs = claimed.filter((r) => !drivenHere(service).has(r.id));
  if (runs.length === 0) return nothing;
  const handedBack: string[] = [];
  const handBack = async (run: SubagentRun, e: Error) => {
    handedBack.push(run.id);
    service.emit({ type: "delegation.recovered", runId: run.id, action: "handed_back", error: e.message });
    // A hand-back that fails too leaves the run leased here, for this process's next boot.
    await repo.handBackRun(run.id, service.owner).catch(() => undefined);
  };
  let roots: SessionRow[];
  let unknownToolCalls: number;
  let discardedForks: string[];
  try {
    // A fork copy its dead owner never finished goes, as at boot, and its run takes the missing-child
    // path; left, its child would stay unreadable and every pass would claim the run and hand it back.
    discardedForks = await repo.discardPrivateSessions(runs.flatMap((r) => r.childSessionId ?? []));
    const gone = new Set(discardedForks);
    runs = runs.map((r) =>
      r.childSessionId && gone.has(r.childSessionId) ? { ...r, childSessionId: null } : r,
    );
    roots = await idleRootParents(service, runs);
    const children = runs.flatMap((r) => r.childSessionId ?? []);
    unknownToolCalls = await settleInterruptedTails(service, [...roots.map((r) => r.id), ...children]);
  } catch (e) {
    for (const run of runs) await handBack(run, toError(e));
    return { ...nothing, handedBack };
  }
  // One run that cannot be recovered now must not strand the others.
  const outcome = await recoverRuns(service, runs, options, handBack);
  await followUpQueued(service, roots);
  return { discardedForks, unknownToolCalls, roots: roots.map((r) => r.id), handedBack, ...outcome };
}

/**
 * The root parents a takeover serves: each distinct root parent of `runs` (or of taken workflows) that no
 * turn of this process holds now.
 */
export async function idleRootParents(
  service: DelegationService,
  parents: readonly { parentSessionId: string; principalAccountId: string }[],
): Promise<SessionRow[]> {
  const seen = new Set<string>();
  const out: SessionRow[] = [];
  for (const p of parents) {
    if (seen.has(p.parentSessionId)) continue;
    seen.add(p.parentSessionId);
    const session = await service.repo.getSession(p.parentSessionId, p.principalAccountId);
    if (session.kind === "root" && !service.turns.isBusy(session.id)) out.push(session);
  }
  return out;
}

/** Root sessions with results waiting get their batched follow-up turn (the last step of boot recovery). */
export async function followUpQueued(
  service: DelegationService,
  roots: readonly SessionRow[],
): Promise<void> {
  for (const root of roots) {
    if ((await service.repo.queuedResultIds(root.id, root.principalAccountId)).length === 0) continue;
    service.track(service.followUp(root));
  }
}

/**
 * Settles the interrupted tails of every journal with a dangling tool call (boot), or of those among
 * `sessionIds` (a live takeover: only journals whose owner died). Returns how many calls were answered.
 */
export async function settleInterruptedTails(
  service: DelegationService,
  sessionIds?: readonly string[],
): Promise<number> {
  if (sessionIds?.length === 0) return 0;
  let answered = 0;
  for (const s of await service.repo.sessionsWithDanglingToolCalls(sessionIds))
    answered += await settleInterruptedTail(service, s.sessionId, s.principalAccountId);
  return answered;
}

/**
 * Settles one journal's interrupted tail: provisional rows discarded, each tool call of its newest turn
 * left without a result answered as unknown (never run again). Returns how many calls were answered.
 */
async function settleInterruptedTail(
  service: DelegationService,
  sessionId: string,
  principalAccountId: string,
): Promise<number> {
  const repo = service.repo;
  await repo.settleProvisional(sessionId, principalAccountId, "discarded");
  // Only the interrupted tail: the newest turn (getLatestTurn), never the whole journal.
  const dangling = danglingToolCalls(await repo.latestTurn(sessionId, principalAccountId));
  if (dangling.length === 0) return 0;
  const answers = [];
  for (const call of dangling)
    answers.push(await unknownOutcome(service, sessionId, principalAccountId, call));
  await repo.append(
    sessionId,
    principalAccountId,
    answers.map((message) => ({ body: { type: "message" as const, message } })),
  );
  return dangling.length;
}

interface RunOutcome {
  continued: string[];
  settledWithoutTurn: string[];
  terminalized: string[];
  failed: string[];
}

const noRuns = (): RunOutcome => ({ continued: [], settledWithoutTurn: [], terminalized: [], failed: [] });

async function recoverRuns(
  service: DelegationService,
  runs: readonly SubagentRun[],
  options: { maxRecoveryAttempts?: number; batch?: number },
  /** Without it, a run's failure fails the whole pass (boot: the daemon does not start). */
  onRunError?: (run: SubagentRun, e: Error) => Promise<void>,
): Promise<RunOutcome> {
  const out = noRuns();
  const max = options.maxRecoveryAttempts ?? 3;
  // Claimed runs are recovered in batches: one statement reads every child's journal tail, one more
  // gives every continuation its generation (one commit for the batch, not one per run). Each batch's
  // executions start as soon as it is decided; the first batch is small, so the first continued turn does
  // not wait for a whole batch of reads and charges.
  let next = 0;
  while (next < runs.length) {
    const size = options.batch ?? (next === 0 ? FIRST_BATCH : RECOVERY_BATCH);
    const batch = runs.slice(next, next + size);
    next += batch.length;
    const starts: RecoveredStart[] = [];
    let failure: Error | undefined;
    try {
      for (const [run, action] of await recoverBatch(service, batch, max, starts)) {
        if (action instanceof Error) {
          if (onRunError) await onRunError(run, action);
          else failure ??= action;
          continue;
        }
        service.emit({ type: "delegation.recovered", runId: run.id, action });
        out[OUTCOME_OF[action]].push(run.id);
      }
    } finally {
      driveAll(service, starts);
    }
    if (failure) throw failure;
  }
  return out;
}

const OUTCOME_OF = {
  continued: "continued",
  settled: "settledWithoutTurn",
  terminalized: "terminalized",
  failed: "failed",
} as const satisfies Record<RecoveryAction, keyof RunOutcome>;

type RecoveryAction = "continued" | "settled" | "terminalized" | "failed";

/**
 * The runs whose recovered execution this process is driving now, per service: a later pass (a takeover
 * sweep) that claims one of them again leaves it to the execution already running.
 */
const driven = new WeakMap<DelegationService, Set<string>>();

function drivenHere(service: DelegationService): Set<string> {
  let set = driven.get(service);
  if (!set) {
    set = new Set();
    driven.set(service, set);
  }
  return set;
}

/** A recovered run to execute; `resumeWith`: the row its turn answers, which the call's start appends. */
interface RecoveredStart {
  readonly run: SubagentRun;
  readonly resumeWith?: JournalWrite;
  /** The child's journal read whole (a short one), handed to the call's first turn with the start's row. */
  readonly journalBefore?: { journal: JournalDelta; nextSeq: number };
}

type Known = { parent: SessionRow; authority: DelegationAuthority };

/**
 * Executes a wave of recovered runs. Their parents and live authority are read once per parent for the
 * wave, just before its executions start (as Delegate reads them just before admitting a call); a parent
 * that cannot be read so is left to each execution's own read, which settles the call when it fails.
 */
function driveAll(service: DelegationService, wave: readonly RecoveredStart[]): void {
  if (wave.length === 0) return;
  const set = drivenHere(service);
  for (const { run } of wave) set.add(run.id);
  const execute = (known: ReadonlyMap<string, Known>) => {
    for (const { run, resumeWith, journalBefore } of wave) {
      const parent = known.get(`${run.principalAccountId}/${run.parentSessionId}`);
      const opts = {
        ...(resumeWith && { resumeWith }),
        ...(journalBefore && { journalBefore }),
        ...(parent && { known: parent }),
      };
      service.track(service.executeRun(run, opts).finally(() => set.delete(run.id)));
    }
  };
  service.track(parentsOf(service, wave).then(execute));
}

async function parentsOf(
  service: DelegationService,
  wave: readonly RecoveredStart[],
): Promise<Map<string, Known>> {
  const known = new Map<string, Known>();
  for (const { run } of wave) {
    const key = `${run.principalAccountId}/${run.parentSessionId}`;
    if (known.has(key)) continue;
    try {
      const parent = await service.repo.getSession(run.parentSessionId, run.principalAccountId);
      known.set(key, { parent, authority: await service.authorityFor(parent) });
    } catch {
      // each execution reads it again and settles its call with the reason
    }
  }
  return known;
}

/**
 * Decides a batch of claimed runs, in their order: what each one's recovery did, or the error that kept
 * it from being recovered now. A run that is to execute is queued on `starts` by its last step.
 */
async function recoverBatch(
  service: DelegationService,
  batch: readonly SubagentRun[],
  maxAttempts: number,
  starts: RecoveredStart[],
): Promise<Map<SubagentRun, RecoveryAction | Error>> {
  const actions = new Map<SubagentRun, RecoveryAction | Error>();
  // A step that answers nothing leaves the run's action to a later step of the batch.
  const attempt = async (run: SubagentRun, step: () => Promise<RecoveryAction | undefined>) => {
    try {
      const action = await step();
      if (action !== undefined) actions.set(run, action);
    } catch (e) {
      actions.set(run, toError(e));
    }
  };
  const started: SubagentRun[] = [];
  for (const run of batch) {
    if (run.status === "queued" || !run.childSessionId) {
      // Never started: nothing ran, so nothing is replayed; the parent learns through an ordinary error result.
      const why = run.childSessionId
        ? "the delegated call never started before a restart"
        : "the child session was discarded before it was ready";
      await attempt(run, async () => {
        await settleError(service, run, why);
        return "terminalized";
      });
    } else started.push(run);
  }
  const tails = await tailsOf(service.repo, started);
  const continuing: Continuation[] = [];
  for (const run of started) {
    const tail = tails.get(run) as ChildTail | Error;
    if (tail instanceof Error) {
      actions.set(run, tail);
      continue;
    }
    await attempt(run, async () => {
      const c = await continuationOf(service, run, tail, maxAttempts);
      if (c === "settled") starts.push({ run });
      else if (c !== "failed") continuing.push(c);
      // a continuation's action is its generation statement's, below
      return c === "settled" || c === "failed" ? c : undefined;
    });
  }
  // one statement (one commit) for the batch; a run another generation took meanwhile is not in it
  const moved =
    continuing.length === 0
      ? new Map<string, Partial<SubagentRun>>()
      : await service.repo
          .nextGenerations(
            continuing.map(({ run, charged }) => ({ runId: run.id, generation: run.generation, charged })),
          )
          .catch(toError);
  for (const c of continuing) {
    const next = moved instanceof Error ? moved : moved.get(c.run.id);
    if (next instanceof Error || !next) {
      actions.set(c.run, next ?? "failed");
      continue;
    }
    const { resumeWith, whole } = c;
    actions.set(c.run, "continued");
    starts.push({
      run: { ...c.run, ...next },
      ...(resumeWith && { resumeWith }),
      ...(whole && { journalBefore: whole }),
    });
  }
  // in the batch's order
  return new Map(batch.map((run) => [run, actions.get(run) as RecoveryAction | Error]));
}

/** A child's journal tail, its inbox (text steers and queued results not yet taken) and its whole journal when short. */
interface ChildTail {
  readonly journal: JournalEntry[];
  readonly pending: number;
  readonly whole?: { readonly journal: JournalDelta; readonly nextSeq: number };
}

/** A run that goes on in a new generation, charged or not, with the row its turn is to answer. */
interface Continuation {
  readonly run: SubagentRun;
  readonly charged: boolean;
  readonly resumeWith?: JournalWrite;
  readonly whole?: { journal: JournalDelta; nextSeq: number };
}

/**
 * Only the newest turn decides: whether it ended with an answer, whether a tool call in it is of unknown
 * outcome, and (with no turn yet) whether the journal is empty.
 */
async function continuationOf(
  service: DelegationService,
  run: SubagentRun,
  { journal, pending, whole }: ChildTail,
  maxAttempts: number,
): Promise<Continuation | "settled" | "failed"> {
  // The turn had ended: settle without a new turn and without charging an attempt.
  if (endsWithAnswer(journal) && pending === 0) return "settled";
  // A child that was waiting on its model (or whose tool calls had all answered) repeats no effect by
  // going on: that costs no recovery attempt, so restarts in a row do not use up its work. Only a
  // continuation after a tool call of unknown outcome is charged and bounded.
  const charged = hasUnknownOutcome(journal);
  const refusal = charged
    ? run.recoveryAttempts >= maxAttempts &&
      `recovery failed after ${run.recoveryAttempts} attempts; verify the child's last step before using DelegateContinue`
    : (run.freeContinuations ?? 0) >= maxAttempts * FREE_CONTINUATIONS_PER_ATTEMPT &&
      `recovery failed: the call was interrupted ${run.freeContinuations ?? 0} times while it waited on its model; delegate it again if it is still needed`;
  if (refusal) {
    await settleError(service, run, refusal);
    return "failed";
  }
  // An empty transcript continues with the original task, an unanswered one with the interrupted context:
  // the call's start appends it (only a start that still holds the run does), and it is then the newest
  // row, so the execution need not read the journal again to know that it does not end with an answer.
  const context: TranscriptMessage = {
    role: "custom",
    customType: "interrupted",
    content: INTERRUPTED_CONTEXT,
  };
  const resumeWith: JournalWrite | undefined =
    journal.length === 0
      ? { body: { type: "message", message: { role: "user", content: run.task } } }
      : !endsWithAnswer(journal)
        ? { body: { type: "message", message: context } }
        : undefined;
  return { run, charged, ...(resumeWith && { resumeWith }), ...(whole && { whole }) };
}

/** Each started run's child tail and inbox, in one statement; a child it does not find is not found. */
async function tailsOf(
  repo: DelegationService["repo"],
  runs: readonly SubagentRun[],
): Promise<Map<SubagentRun, ChildTail | Error>> {
  const out = new Map<SubagentRun, ChildTail | Error>();
  if (runs.length === 0) return out;
  const all = await repo
    .journalTailsWithWork(
      runs.map((r) => ({ sessionId: r.childSessionId as string, principalAccountId: r.principalAccountId })),
    )
    .catch(toError);
  for (const run of runs) {
    const found = all instanceof Error ? all : all.get(run.childSessionId as string);
    if (found instanceof Error) out.set(run, found);
    else if (found) {
      const pending = found.work.pendingSteers + found.work.queuedResults;
      out.set(run, { journal: found.tail, pending, ...(found.whole && { whole: found.whole }) });
    } else {
      // Not in the batch: the child is not a visible session of the account (a read of it alone says so).
      out.set(run, new DelegationError("not_found", "session not found", { sessionId: run.childSessionId }));
    }
  }
  return out;
}

/** Free continuations allowed per recovery attempt: a child interrupted over and over still ends. */
const FREE_CONTINUATIONS_PER_ATTEMPT = 5;

/** Whether the journal's newest turn holds a tool call a restart left of unknown outcome. */
function hasUnknownOutcome(journal: readonly JournalEntry[]): boolean {
  for (let i = journal.length - 1; i >= 0; i--) {
    const b = journal[i]?.body;
    if (b?.type !== "message") continue;
    const m = b.message;
    if (m.role === "assistant") return false;
    if (m.role === "toolResult" && typeof m.content === "string" && m.content.startsWith(UNKNOWN_OUTCOME))
      return true;
  }
  return false;
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
    parentSessionId: run.parentSessionId,
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
