import { randomUUID } from "node:crypto";
import { PgDelegationRepository } from "@crw/db";
import type pg from "pg";
import { afterEach } from "vitest";
import {
  hostAccessors,
  JournalNodeDispatcher,
  type NodeDispatcher,
  type OriginAccessInput,
  PgWorkflowStore,
  parseWorkflowDefinition,
  pgWorkflowEmitter,
  readOrchestrationJournal,
  scriptedNodeTurnRunner,
  type WorkflowCallContext,
  type WorkflowDefinition,
  type WorkflowEmitter,
  WorkflowEngine,
  type WorkflowEngineOptions,
  type WorkflowEvent,
} from "../src/index.js";

export interface Deferred<T = void> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (e: unknown) => void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

export type Answer = (input: {
  sessionId: string;
  task: string;
  signal: AbortSignal;
}) => Promise<string> | string;

/** Resolves when `fn` holds, checking on every macrotask (bounded: a broken expectation fails the test). */
export async function until(
  fn: () => boolean | Promise<boolean>,
  what = "condition",
  ms = 10_000,
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Rejects when `signal` aborts: a scripted turn that stays in flight until it is interrupted. */
export function untilAborted(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) reject(new Error("aborted"));
    signal.addEventListener("abort", () => reject(new Error("aborted")), { once: true });
  });
}

export interface World {
  repo: PgDelegationRepository;
  accountId: string;
  parentSessionId: string;
  ctx: (
    overrides?: Partial<WorkflowCallContext> & { access?: Partial<OriginAccessInput> },
  ) => WorkflowCallContext;
  engine: (
    answer: Answer,
    options?: Partial<WorkflowEngineOptions> & { wrap?: (d: NodeDispatcher) => NodeDispatcher },
  ) => Promise<{ engine: WorkflowEngine; events: WorkflowEvent[]; dispatcher: NodeDispatcher }>;
  engines: WorkflowEngine[];
}

export async function world(pool: pg.Pool, account: { toolAllow?: string[] | null } = {}): Promise<World> {
  const repo = new PgDelegationRepository(pool);
  const acct = await repo.createAccount({
    name: `a-${randomUUID()}`,
    isOwner: true,
    toolAllow: account.toolAllow ?? null,
  });
  const parent = await repo.createRootSession(acct.id, "scripted");
  const engines: WorkflowEngine[] = [];
  return {
    repo,
    accountId: acct.id,
    parentSessionId: parent.id,
    engines,
    ctx: (overrides = {}) => ({
      parentSessionId: parent.id,
      principalAccountId: acct.id,
      toolCallId: `call-${randomUUID()}`,
      currentAccess: async () => ({
        accountId: acct.id,
        operator: true,
        target: { kind: "host", ref: null },
        ...overrides.access,
      }),
      currentWorkDir: async () => null,
      ...hostAccessors(),
      ...overrides,
    }),
    engine: async (answer, options = {}) => {
      const events: WorkflowEvent[] = [];
      const base = new JournalNodeDispatcher(repo, scriptedNodeTurnRunner(answer));
      const dispatcher = options.wrap ? options.wrap(base) : base;
      const engine = new WorkflowEngine({
        pool,
        owner: `test-${randomUUID()}`,
        dispatcher,
        defaultModel: "scripted",
        repo,
        onEvent: (e) => events.push(e),
        ...options,
      });
      await engine.open();
      engines.push(engine);
      return { engine, events, dispatcher };
    },
  };
}

/** One node, a: the smallest workflow. */
export const oneNodeDefinition = parseWorkflowDefinition(`
name: one
nodes:
  - { id: a, task: "TASK a" }
`);

/** Two nodes, b after a: the smallest workflow with a dependency. */
export const chainDefinition = parseWorkflowDefinition(`
name: chain
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
`);

/** A `wrap` for `World.engine`: the base dispatcher, each child's creation request shown to `seen` first. */
export function seeingChildren(seen: (request: Parameters<NodeDispatcher["createChild"]>[0]) => void) {
  return (base: NodeDispatcher): NodeDispatcher => ({
    createChild: (r) => {
      seen(r);
      return base.createChild(r);
    },
    runNode: (r) => base.runNode(r),
    continueNode: (r, host) => base.continueNode(r, host),
  });
}

/** Starts `definition` in a first engine and closes it while `nodeId`'s turn runs: a boot finds it interrupted. */
export async function interruptedMidTurn(w: World, definition: WorkflowDefinition, nodeId: string) {
  const first = await w.engine(({ signal }) => untilAborted(signal));
  try {
    const started = await first.engine.start(w.ctx(), { definition });
    await until(
      () => first.engine.run(started.workflowId)?.started.has(nodeId) === true,
      `${nodeId} running`,
    );
    return started;
  } finally {
    await first.engine.close();
  }
}

export async function summaries(
  pool: pg.Pool,
  parentSessionId: string,
): Promise<Array<{ id: string; body: string; outcome: string; kind: string }>> {
  const { rows } = await pool.query(
    "select id, body, outcome, kind from delegation_results where parent_session_id = $1::uuid order by queue_seq",
    [parentSessionId],
  );
  return rows as Array<{ id: string; body: string; outcome: string; kind: string }>;
}

export const taskLine = (task: string): string => task.split("\n")[0] ?? "";

/** The engines a test file opens, each closed after its test. */
export function closeEnginesAfterEach(): WorkflowEngine[] {
  const all: WorkflowEngine[] = [];
  afterEach(async () => {
    for (const e of all.splice(0)) await e.close();
  });
  return all;
}

/** A workflow's orchestration journal as stored (its header and node rows, assembled). */
export async function workflowJournal(pool: pg.Pool, workflowId: string) {
  const r = readOrchestrationJournal(await new PgWorkflowStore(pool).readJournal(workflowId));
  if (!r.ok) throw new Error(r.reason);
  return r.journal;
}

/**
 * Stores `journal` whole, bypassing the engine's fence: the document layout an older process left (read
 * as it is until the next write of a run).
 */
export async function storeWholeJournal(pool: pg.Pool, workflowId: string, journal: unknown): Promise<void> {
  await pool.query("delete from workflow_journal_nodes where workflow_id = $1::uuid", [workflowId]);
  await pool.query(
    "update workflow_journals set body = $2::jsonb, node_rows = false where workflow_id = $1::uuid",
    [workflowId, JSON.stringify(journal)],
  );
}

/** The transcript messages of a child session, in journal order. */
export async function childMessages(
  pool: pg.Pool,
  childId: string,
): Promise<Array<{ role: string; content: unknown; customType?: string }>> {
  const { rows } = await pool.query(
    "select body from journal_entries where session_id = $1::uuid order by seq",
    [childId],
  );
  return rows.map((r) => JSON.parse(r.body).message);
}

/** The host's own emitter over the native record: what a test's emitter hands an update on to. */
export function nativeEmitter(pool: pg.Pool): WorkflowEmitter {
  return (update, expected) => pgWorkflowEmitter(new PgWorkflowStore(pool))(update, expected);
}
