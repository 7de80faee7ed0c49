import { randomUUID } from "node:crypto";
import { type JournalEntry, PgDelegationRepository, type TranscriptMessage } from "@crw/db";
import { scratchDir } from "@crw/tools/scratch";
import type pg from "pg";
import { onTestFailed } from "vitest";
import {
  createScriptedTurnRunner,
  DelegationService,
  type DelegationServiceOptions,
  FileSpillStore,
  type MutatingTool,
  type Script,
  type SessionTurnRunner,
  scriptTask,
  type TurnRequest,
} from "../../src/index.js";

export { removeScratchDirs, scratchDir } from "@crw/tools/scratch";
export { scriptTask };

export function makeService(pool: pg.Pool, overrides: Partial<DelegationServiceOptions> = {}) {
  const repo = new PgDelegationRepository(pool);
  const spillRoot = scratchDir("crw-spill-");
  const service = new DelegationService({
    repo,
    runner: createScriptedTurnRunner(),
    spill: new FileSpillStore(spillRoot),
    helperWaitMs: 200,
    ...overrides,
  });
  closeIfTheTestFails(service);
  return { repo, service, spillRoot };
}

/**
 * A test that fails before its own `close()` would leave the service's owner lease holding a connection
 * of the file's pool: the pool's end after the file then waits out the hook timeout, and a few such
 * failures use up the pool, so that the tests after them hang. Closed when the test fails, a failure stays
 * the quick assertion it is. (A service made outside a test is left to its maker.)
 */
function closeIfTheTestFails(service: DelegationService): void {
  try {
    onTestFailed(() => service.close(), 10_000);
  } catch {
    // not inside a test
  }
}

export async function newParent(
  service: DelegationService,
  account: Partial<Parameters<PgDelegationRepository["createAccount"]>[0]> = {},
) {
  const acct = await service.repo.createAccount({ name: `acct-${randomUUID()}`, ...account });
  const parent = await service.createRootSession(acct.id, "scripted");
  return { account: acct, parent };
}

export const delegateCall = (child: Script, extra: Record<string, unknown> = {}) => ({
  name: "Delegate",
  arguments: { task: scriptTask(child), ...extra },
});

/** Polls `check` until it holds; every wait in a test has this bound. */
export async function waitFor<T>(
  check: () => Promise<T | undefined | false>,
  what: string,
  boundMs = 20_000,
): Promise<T> {
  const deadline = Date.now() + boundMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function messages(entries: readonly JournalEntry[]): TranscriptMessage[] {
  return entries.flatMap((e) => (e.body.type === "message" ? [e.body.message] : []));
}

export function resultIdsIn(entries: readonly JournalEntry[]): string[] {
  return messages(entries).flatMap((m) =>
    (m.role === "custom" || m.role === "toolResult") && m.details?.resultId ? [m.details.resultId] : [],
  );
}

/** A tool that waits for a gate the test opens (bounded). */
export function gateTool(name: string, gates: Map<string, Promise<void>>, mutates = false): MutatingTool {
  return {
    name,
    description: "waits for the test",
    parameters: {},
    mutates,
    async execute(args) {
      const key = String(args.key ?? "default");
      const gate = gates.get(key);
      if (gate) await Promise.race([gate, new Promise((r) => setTimeout(r, 15_000))]);
      return { content: `gate ${key} open` };
    },
  };
}

/** A read-only tool named Probe that runs `look` when a turn calls it: to see the database mid-turn. */
export function probeTool(look: () => Promise<void>): MutatingTool {
  return {
    name: "Probe",
    description: "looks at the database while the turn runs",
    parameters: {},
    mutates: false,
    async execute() {
      await look();
      return { content: "probed" };
    },
  };
}

export function latch() {
  let open!: () => void;
  const promise = new Promise<void>((r) => {
    open = r;
  });
  return { promise, open };
}

/**
 * A background helper of `child` whose run has settled with `body`: its result waits in the child's inbox.
 * Returns the result id.
 */
export async function settledHelperResult(
  repo: PgDelegationRepository,
  child: { id: string; scope?: string | null },
  principalAccountId: string,
  toolCallId: string,
  body: string,
): Promise<string> {
  const helper = await repo.createDelegation({
    parentSessionId: child.id,
    principalAccountId,
    toolCallId,
    task: "helper",
    mode: "background",
    model: "scripted",
    scope: child.scope ?? "",
  });
  const resultId = randomUUID();
  await repo.settleRun({
    runId: helper.run.id,
    generation: 1,
    resultId,
    outcome: "ok",
    body,
    byteSize: Buffer.byteLength(body),
  });
  return resultId;
}

/** A mutating tool named Write that always succeeds. */
export const writeTool: MutatingTool = {
  name: "Write",
  description: "writes",
  parameters: {},
  mutates: true,
  async execute() {
    return { content: "written" };
  },
};

/** A runner that records every turn request before `inner` (the scripted runner by default) runs it. */
export function recording(inner: SessionTurnRunner = createScriptedTurnRunner()) {
  const seen: TurnRequest[] = [];
  const runner: SessionTurnRunner = {
    runTurn: (request, host) => {
      seen.push(request);
      return inner.runTurn(request, host);
    },
  };
  return { seen, runner };
}

/** The parent session and its principal account a call is made from. */
export interface Caller {
  parent: { id: string };
  account: { id: string };
}

/**
 * A call admitted but not yet run (queued, generation 1), with the scope a Delegate captures: copied from a
 * child this parent delegated just before.
 */
export async function queuedCall(
  service: DelegationService,
  caller: Caller,
  toolCallId: string,
  task: string,
) {
  const child = await answeredChild(service, caller, `${toolCallId}-scope`, "x");
  const scope = (await service.repo.getSession(child, caller.account.id)).scope ?? "";
  const { run } = await service.repo.createDelegation({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId,
    task,
    mode: "background",
    model: "scripted",
    scope,
  });
  return run;
}

/** A workflow's whole-workflow summary for `sessionId`'s call wf (or `toolCallId`), ended ok. */
export function emitSummary(
  service: DelegationService,
  sessionId: string,
  principalAccountId: string,
  summary = "the workflow finished",
  toolCallId = "wf",
) {
  return service.emitDelegationCompletion({
    kind: "workflow_summary",
    parentSessionId: sessionId,
    principalAccountId,
    toolCallId,
    outcome: "ok",
    summary,
  });
}

/** A foreground delegation from `caller`'s parent session. */
export function delegateForeground(
  service: DelegationService,
  caller: Caller,
  toolCallId: string,
  task: string,
) {
  return service.delegate({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId,
    task,
    mode: "foreground",
  });
}

/** A child of `caller`'s parent that a foreground delegation ran and answered with `answer`: its session id. */
export async function answeredChild(
  service: DelegationService,
  caller: Caller,
  toolCallId: string,
  answer: string,
): Promise<string> {
  const first = await delegateForeground(service, caller, toolCallId, scriptTask({ answer }));
  if (first.kind !== "result") throw new Error("expected a result");
  return first.childSessionId;
}

/** A background delegation from `caller`'s parent session. */
export function delegateBackground(
  service: DelegationService,
  caller: Caller,
  toolCallId: string,
  task: string,
) {
  return service.delegate({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId,
    task,
    mode: "background",
  });
}

/** A foreground continuation of `childSessionId` from `caller`'s parent session. */
export function continueForeground(
  service: DelegationService,
  caller: Caller,
  childSessionId: string,
  toolCallId: string,
  text: string,
) {
  return service.continueSubagent({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    childSessionId,
    toolCallId,
    text,
    mode: "foreground",
  });
}

/**
 * A service whose repository and runner record, for `watched` sessions, each journal read (with the seq it
 * reads after) and each turn (with the roles of its context), in the order they happen. `duringTurn` runs
 * inside the watched session's first turn.
 */
export function observeReads(pool: pg.Pool, duringTurn?: (sessionId: string) => Promise<void>) {
  const events: string[] = [];
  const contexts: TranscriptMessage[][] = [];
  const watched = new Set<string>();
  const scripted = createScriptedTurnRunner();
  let turns = 0;
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      if (watched.has(request.sessionId)) {
        events.push(`turn(${request.context.map((m) => m.role).join(",")})`);
        contexts.push([...request.context]);
        if (turns++ === 0) await duringTurn?.(request.sessionId);
      }
      return scripted.runTurn(request, host);
    },
  };
  const made = makeService(pool, { runner });
  const read = made.repo.readJournalAfter.bind(made.repo);
  made.repo.readJournalAfter = (sessionId, principal, afterSeq) => {
    if (watched.has(sessionId)) events.push(`read(${afterSeq})`);
    return read(sessionId, principal, afterSeq);
  };
  return { ...made, events, contexts, watched };
}

/** The parent's turn that asks for a fork answering "forked ok", then answers "parent done" itself. */
export function askForFork(service: DelegationService, caller: Caller) {
  return service.prompt(
    caller.parent.id,
    caller.account.id,
    scriptTask({
      rounds: [[delegateCall({ answer: "forked ok" }, { fork: true })]],
      answer: "parent done",
    }),
  );
}

/**
 * A task that starts a background helper whose turn waits at the Gate tool's `gateKey` and then answers
 * `helperAnswer`; the task's own turn goes on as `rest` says (its answer, a follow-up).
 */
export function gatedHelperTask(gateKey: string, helperAnswer: string, rest: Omit<Script, "rounds">) {
  return scriptTask({
    rounds: [
      [
        delegateCall(
          { rounds: [[{ name: "Gate", arguments: { key: gateKey } }]], answer: helperAnswer },
          { background: true },
        ),
      ],
    ],
    ...rest,
  });
}

/** A task whose turn calls Write once, then answers `answer`. */
export function writeTask(answer: string) {
  return scriptTask({ rounds: [[{ name: "Write", arguments: {} }]], answer });
}

/**
 * A service with a recording runner, the Write tool and a Gate tool whose `gateKey` stays shut until the
 * returned `gate` opens.
 */
export function serviceWithGate(pool: pg.Pool, gateKey: string) {
  const { seen, runner } = recording();
  const gates = new Map<string, Promise<void>>();
  const gate = latch();
  gates.set(gateKey, gate.promise);
  const made = makeService(pool, { runner, tools: () => [writeTool, gateTool("Gate", gates)] });
  return { ...made, seen, gate };
}

/**
 * A continuation of `childSessionId` interrupted by a crash: admitted and started by an owner that is gone,
 * so boot recovery is what runs it.
 */
export async function interruptedContinuation(
  service: DelegationService,
  caller: Caller,
  childSessionId: string,
  toolCallId: string,
  task: string,
) {
  const { run } = await service.repo.createContinuation({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    childSessionId,
    toolCallId,
    task,
    mode: "background",
    readOnlyScope: null,
  });
  await service.repo.startRun(run.id, run.generation, "dead-owner");
  return run;
}

/**
 * A background call of `parent` whose child a dead owner had started (`fork`: the child is a private copy
 * of the parent that owner never finished).
 */
export async function deadOwnersRun(
  service: DelegationService,
  caller: Caller,
  task: string,
  options: { fork?: boolean } = {},
) {
  const { run, child } = await service.repo.createDelegation({
    parentSessionId: caller.parent.id,
    principalAccountId: caller.account.id,
    toolCallId: `t-${randomUUID()}`,
    task,
    mode: "background",
    model: "scripted",
    scope: JSON.stringify({ accountId: caller.account.id, target: { kind: "host", ref: null } }),
    ...(options.fork && { fork: { fromSessionId: caller.parent.id } }),
  });
  await service.repo.startRun(run.id, run.generation, `dead-${randomUUID()}`);
  return { run, child };
}

/** Waits until the run has succeeded and the service has nothing left running. */
export async function finished(service: DelegationService, runId: string, accountId: string) {
  await waitFor(async () => (await service.repo.getRun(runId, accountId)).status === "succeeded", "the run");
  await service.whenIdle();
}

/** A repository over `pool` whose named methods go through `wrap`, which is given the real one. */
export function repoWith(
  pool: pg.Pool,
  wrap: {
    [K in keyof PgDelegationRepository]?: (real: PgDelegationRepository[K]) => PgDelegationRepository[K];
  },
): PgDelegationRepository {
  const real = new PgDelegationRepository(pool);
  return new Proxy(real, {
    get(target, key, receiver) {
      const value = Reflect.get(target, key, receiver) as unknown;
      const through = wrap[key as keyof PgDelegationRepository] as ((f: unknown) => unknown) | undefined;
      return through && typeof value === "function" ? through(value.bind(target)) : value;
    },
  });
}
