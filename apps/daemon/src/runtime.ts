import { randomUUID } from "node:crypto";
import { realpathSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import {
  catalogPolicyFrom,
  createAgentTurnRunner,
  DelegationService,
  FileSpillStore,
  followUpQueued,
  idleRootParents,
  McpBridge,
  type ProgressEvent,
  type ProgressSink,
  type RecoveryReport,
  recoverDelegations,
  type SessionTurnRunner,
  settleInterruptedTails,
  type TurnRequest,
  takeOverDelegations,
  withToolCatalog,
} from "@crw/brain";
import {
  listenForOwnerReleases,
  PgDelegationRepository,
  type ProviderUsageReport,
  recordProviderUsage,
  type SessionRow,
  sessionPrincipal,
} from "@crw/db";
import {
  delegationNodeTurns,
  handleWorkflowAddNodes,
  JournalNodeDispatcher,
  sessionProjectFileReader,
  WorkflowEngine,
  type WorkflowEvent,
  workflowTools,
} from "@crw/plugin-subagent";
import {
  createSubagentRuntime,
  type HostRpcHandler,
  HostRpcRefusedError,
  killContainedProcesses,
  MemoryRetryPolicySource,
  type PoolHealth,
  type ProcessChangedSink,
  parseSubagentConfig,
  RESTART_REQUIRED_ALERT_KEY,
  type SubagentRunnerPool,
} from "@crw/subagent";
import type pg from "pg";
import type { Logger } from "pino";
import { AlertService } from "./alerts.js";
import type { DaemonConfig } from "./config.js";
import { EventBus } from "./events.js";
import { projectRegistry } from "./projects.js";
import {
  type OrphanedWork,
  startTakeoverSweep,
  type TakeoverHealth,
  type TakeoverPass,
  type TakeoverSweep,
} from "./takeover.js";
import { inboxWakeKey, WakeHub, wakeOnJournalWrites } from "./wake.js";

/** What boot recovery did, shown in /health. */
export interface BootRecovery {
  readonly startedAt: string;
  readonly finishedAt: string | null;
  readonly delegations: RecoveryReport | null;
  readonly workflows: { resumed: string[]; invalid: string[]; refused: string[] } | null;
  /** When the first turn after boot was placed (a resumed child or node, else new work). */
  readonly firstTurnAt: string | null;
  readonly error: string | null;
}

/** A database call of the delegation core still running (what a checkpoint past its deadline names). */
export interface PendingCall {
  readonly call: string;
  readonly sessionId: string | null;
  readonly sinceMs: number;
}

/** One configured MCP server as /health shows it. */
export interface McpServerHealth {
  readonly name: string;
  readonly tools: number;
  readonly running: boolean;
  /** running, restarting (waiting for its next start attempt), failed (given up: see lastError), stopped. */
  readonly state: "running" | "restarting" | "failed" | "stopped";
  readonly restarts: number;
  /** Consecutive failed start attempts since it last exited. */
  readonly attempts: number;
  /** Why it is not running (its exit and stderr tail, or the last start attempt's error). */
  readonly lastError: string | null;
}

export type TurnObserver = (request: TurnRequest, placement: "runner" | "in-process") => void;

/**
 * Where a session executes now: in a runner (its id and placement state, from the pool's route bookkeeping)
 * or in this daemon's own process (a turn running here), else nowhere.
 */
export type ExecutionLocation =
  | {
      readonly location: "runner";
      readonly runnerId: string | null;
      readonly state: "queued" | "running" | "idle";
    }
  | { readonly location: "in-process"; readonly state: "running" }
  | { readonly location: "none" };

/** A delivery acknowledgement as fanned out to live views, after the durable re-read confirmed it. */
export interface DeliveryNotice {
  readonly parentSessionId: string;
  readonly results: readonly { resultId: string; toolCallId: string; kind: string }[];
}

/**
 * delegatedWorkflowExpansionAvailable: a node's child may be offered WorkflowAddNodes when its turn runs in
 * this daemon, or in a runner whose pool has the shared reverse host-call handler (supportsHostRpc, which
 * takes no method argument; the method itself is dispatched and authorized by the typed RPC request).
 */
export function delegatedWorkflowExpansionAvailable(
  placement: "runner" | "in-process",
  pool: Pick<SubagentRunnerPool, "supportsHostRpc">,
): boolean {
  return placement === "in-process" || pool.supportsHostRpc();
}

export interface DaemonRuntime {
  readonly repo: PgDelegationRepository;
  readonly service: DelegationService;
  readonly engine: WorkflowEngine;
  readonly runnerPool: SubagentRunnerPool;
  readonly alerts: AlertService;
  readonly bus: EventBus;
  /** Wakes live views (tap, follow) when the rows they show change, in this process or another. */
  readonly wake: WakeHub;
  /** Placement counts since start: how many turns ran in runners and in the daemon. */
  readonly placements: { runner: number; "in-process": number };
  /** The child's execution location (see ExecutionLocation). */
  executionFor(sessionId: string): ExecutionLocation;
  /** Every session executing now, in runners or in this process. */
  executions(): ({ sessionId: string } & ExecutionLocation)[];
  /**
   * The daemon's delivery publisher: re-reads the parent's journal (the durable proof of delivery) and fans
   * out only the results it confirms. Both the in-process delegation core and the runners' result-delivered
   * host calls (through the pool's sink) publish here. Returns what was published.
   */
  publishDelivery(delivery: DeliveryNotice): Promise<DeliveryNotice | null>;
  /** A progress sink that publishes to the live views of each event's session. */
  progressSink(extra?: ProgressSink): ProgressSink;
  /** Boot recovery of delegations, then workflows; runs before the API port opens. */
  recover(): Promise<BootRecovery>;
  /**
   * One live takeover pass: the boot pass restricted to the work of owners that died (workflows, then
   * delegations), with the interrupted tails of what it took and of their root parents settled first.
   */
  takeOver(work: OrphanedWork): Promise<TakeoverPass>;
  /** Starts the periodic takeover sweep and the listener for peers' lease releases (after boot recovery). */
  startTakeover(): Promise<void>;
  /** Stops both; no work is taken over after this resolves. Idempotent. */
  stopTakeover(): Promise<void>;
  /** The delegation core's database calls in flight now, oldest first. */
  pendingCalls(): PendingCall[];
  health(): {
    pool: PoolHealth;
    mcp: { servers: McpServerHealth[] };
    recovery: BootRecovery | null;
    takeover: TakeoverHealth | null;
    workflows: { driving: number };
    executions: ({ sessionId: string } & ExecutionLocation)[];
    processes: { started: number; exited: number };
    steering: { settled: number };
    providerUsage: {
      responses: number;
      input: number;
      output: number;
      totalTokens: number;
      cost: number;
      unrecorded: number;
    };
  };
  /**
   * The restart checkpoint (the delegation core's pauseForRestart): no new delegated work or journal write is
   * admitted; every captured journal write and result publication commits, a finished tool result queued
   * behind an in-flight write included. Model and tool turns are not waited for (boot recovery continues
   * them). Rejects when a drained write failed. Idempotent.
   */
  pause(): Promise<void>;
  /**
   * Graceful stop, after `pause`: the database pool stops taking new statements and finishes those in flight;
   * then runners, the workflow engine and the delegation core let go. Interrupted turns are left to the next
   * boot's recovery, never settled as failures by the shutdown itself.
   */
  close(options?: { abandonCheckpoint?: boolean }): Promise<void>;
}

/** The `runner_id` of provider usage from the daemon's own (in-process) turns. */
export const IN_PROCESS_RUNNER_ID = "in-process";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The repository with its calls in flight recorded (method and session), so a shutdown whose checkpoint
 * does not finish can say which journal writes it still waited for.
 */
function trackedRepository(inner: PgDelegationRepository): {
  repo: PgDelegationRepository;
  pending(): PendingCall[];
} {
  const inFlight = new Map<number, { call: string; sessionId: string | null; since: number }>();
  let next = 0;
  const repo = new Proxy(inner, {
    get(target, key, receiver) {
      const value = Reflect.get(target, key, receiver) as unknown;
      if (typeof value !== "function" || typeof key !== "string") return value;
      return (...args: unknown[]) => {
        const id = next++;
        const first = args[0];
        inFlight.set(id, {
          call: key,
          sessionId: typeof first === "string" && UUID.test(first) ? first : null,
          since: Date.now(),
        });
        let result: unknown;
        try {
          result = (value as (...a: unknown[]) => unknown).apply(target, args);
        } catch (e) {
          inFlight.delete(id);
          throw e;
        }
        if (result instanceof Promise)
          return result.finally(() => {
            inFlight.delete(id);
          });
        inFlight.delete(id);
        return result;
      };
    },
  });
  return {
    repo,
    pending: () =>
      [...inFlight.values()]
        .sort((a, b) => a.since - b.since)
        .map((p) => ({ call: p.call, sessionId: p.sessionId, sinceMs: Date.now() - p.since })),
  };
}

/** Waits for `work`, at most `ms`; a stop past its deadline must not hang on a part that cannot let go. */
const within = (work: Promise<unknown>, ms: number): Promise<unknown> =>
  Promise.race([work, new Promise((r) => setTimeout(r, ms).unref())]);

/** The daemon's parts wired together: db + brain (delegation core, agent loop) + runner pool + the Sub-agent plugin. */
export async function assembleRuntime(
  config: DaemonConfig,
  pgPool: pg.Pool,
  log: Logger,
  observeTurn?: TurnObserver,
  /** Hears when a connection holding one of this runtime's owner leases fails (see holdOwnerLease). */
  onLeaseLost?: (owner: string, e: unknown) => void,
): Promise<DaemonRuntime> {
  const tracked = trackedRepository(new PgDelegationRepository(pgPool, onLeaseLost ? { onLeaseLost } : {}));
  const bus = new EventBus();
  // Live views wake on commits: this process's journal writes directly, other processes' through NOTIFY
  // (one listening connection, opened once the runtime is assembled; writes notify only what some process
  // watches, and every write until then).
  const wake = new WakeHub();
  const repo = wakeOnJournalWrites(tracked.repo, wake);
  const alerts = await AlertService.open(config.dataDir);
  // The old process's build-mismatch latch died with it: its alert is cleared before the new sink attaches.
  await alerts.clear(RESTART_REQUIRED_ALERT_KEY);
  const owner = `crw-daemon-${process.pid}-${randomUUID()}`;
  const policy = new MemoryRetryPolicySource({
    revision: 1,
    maxRetries: 2,
    initialDelayMs: 500,
    multiplier: 2,
  });
  const maxRunners = config.runtime.maxRunners ?? Math.max(1, Math.min(4, cpus().length));
  let engine!: WorkflowEngine;
  // The shared reverse host-call handler runners call back through. workflow.addNodes goes to the plugin's
  // handler, admitted only for the running node whose child made the call; other methods have no daemon
  // service in crw yet and are refused with a typed error (never dropped).
  const hostRpc: HostRpcHandler = async (method, params, context) => {
    if (method === "workflow.addNodes")
      return handleWorkflowAddNodes(engine, params as Parameters<typeof handleWorkflowAddNodes>[1], {
        sessionId: context.sessionId,
      });
    throw new HostRpcRefusedError("unsupported", `the daemon serves no ${method} host call`);
  };
  const placements = { runner: 0, "in-process": 0 };
  let firstTurnAt: string | null = null;
  const catalog = { baseUrls: config.models.baseUrls, apiKeyEnv: config.models.apiKeyEnv };
  // Turns running in this process, by session: the in-process half of the execution projection.
  const inProcessTurns = new Map<string, number>();
  // Provider usage, one row per provider response in `provider_usage` (migration 0028), counted for /health
  // and published to the session's live views. Runner turns report through the pool's sink (`providerUsage`
  // frames); the daemon's own turns (root sessions, runners off) through the agent loop's hook, as runner
  // "in-process". Each response is reported once, by the process that made the request. A row that cannot
  // be written is logged, never retried.
  const usage = { responses: 0, input: 0, output: 0, totalTokens: 0, cost: 0, unrecorded: 0 };
  const recordUsage = (report: ProviderUsageReport): void => {
    const u = report.usage;
    const cost = u.cost ?? 0;
    usage.responses += 1;
    usage.input += u.input;
    usage.output += u.output;
    usage.totalTokens += u.totalTokens;
    usage.cost += cost;
    bus.publish(`session:${report.sessionId}`, { type: "provider_usage", ...report });
    recordProviderUsage(pgPool, report).catch((e: unknown) => {
      usage.unrecorded += 1;
      log.warn({ err: e, sessionId: report.sessionId }, "provider usage not recorded");
    });
  };
  const agentLoop = createAgentTurnRunner({
    ...catalog,
    onProviderUsage: ({ sessionId, turnId, usage: u }) =>
      recordUsage({ runnerId: IN_PROCESS_RUNNER_ID, sessionId, turnId, usage: u }),
  });
  const inProcess: SessionTurnRunner = {
    async runTurn(request, host) {
      inProcessTurns.set(request.sessionId, (inProcessTurns.get(request.sessionId) ?? 0) + 1);
      try {
        return await agentLoop.runTurn(request, host);
      } finally {
        const n = (inProcessTurns.get(request.sessionId) ?? 1) - 1;
        if (n > 0) inProcessTurns.set(request.sessionId, n);
        else inProcessTurns.delete(request.sessionId);
      }
    },
  };
  // MCP servers before the delegation core: every session's catalog includes their tools from the first
  // turn on. A server that cannot start fails the daemon's start (typed McpError naming the server).
  // A server that exits later is restarted by the bridge (bounded backoff); its life is logged here.
  const mcp = await McpBridge.start(config.mcp, {
    onEvent: (e) => {
      if (e.type === "server_restarted") {
        if (e.toolsChanged)
          log.warn(
            { server: e.server, added: e.toolsAdded, removed: e.toolsRemoved },
            "MCP server restarted with a changed tool list; sessions keep the tools listed at start",
          );
        else log.info({ server: e.server, attempt: e.attempt, pid: e.pid }, "MCP server restarted");
      } else if (e.type === "server_exited")
        log.warn({ server: e.server, stderr: e.stderr, willRestart: e.willRestart }, "MCP server exited");
      else if (e.type === "restart_failed")
        log.warn(
          { server: e.server, attempt: e.attempt, err: e.error, nextDelayMs: e.nextDelayMs },
          "MCP server restart failed",
        );
      else log.error({ server: e.server, attempts: e.attempts, reason: e.reason }, "MCP server stays down");
    },
  });
  const catalogPolicy = catalogPolicyFrom(config.tools);
  // The package's entry point builds the pool and the session dispatch (the delegation core's SessionTurnRunner).
  const subagentConfig = parseSubagentConfig({
    subagentRunnerEnabled: config.runtime.subagentRunnerEnabled,
    maxRunners,
    turnsPerRunner: config.runtime.turnsPerRunner,
    runnerKind: "agent",
  });
  const { pool: runnerPool, dispatch } = createSubagentRuntime({
    config: () => subagentConfig,
    retryPolicySource: () => policy,
    inProcess,
    catalog: () => ({
      revision: 1,
      public: [{ id: config.models.default, provider: config.models.default.split(":")[0] ?? "scripted" }],
      accounts: {},
    }),
    // Runners build their agent loop with the same provider settings as the daemon's own.
    agentOptions: () => catalog,
    hostRpc,
    onPlaced: (request, placement) => {
      placements[placement] += 1;
      observeTurn?.(request, placement);
      firstTurnAt ??= new Date().toISOString();
    },
    // A child's channel (fairness key, unit of abort) is its parent session: the turn's own (from the row
    // the turn was built from), else read from its row.
    placementOf: async (request) => {
      const parentSessionId =
        request.parentSessionId !== undefined
          ? request.parentSessionId
          : (await repo.getSession(request.sessionId, request.principalAccountId)).parentSessionId;
      return parentSessionId
        ? { channelId: parentSessionId, parentSessionId }
        : { channelId: request.sessionId };
    },
    onEvent: (event) => {
      if (event.type === "runner_log") return;
      log.info({ event }, "runner pool event");
    },
  });
  // Processes a runner started die with it: a killed runner's contained processes are ended.
  runnerPool.attachRunnerExitTokensSink(({ killTokens }) => {
    const killed = killContainedProcesses(killTokens);
    if (killed > 0) log.warn({ killed }, "contained processes of an exited runner ended");
  });
  runnerPool.attachRestartRequiredSink(async (alert) => {
    try {
      await alerts.raise({
        key: alert.key,
        severity: alert.severity,
        audience: alert.audience,
        text: alert.text,
      });
      log.warn({ key: alert.key }, "restart required alert raised");
    } catch (e) {
      // An alert that cannot be stored is logged; the pool's own typed startup error stays what callers see.
      log.error({ err: e, key: alert.key }, "restart required alert could not be stored");
    }
  });

  const processes = { started: 0, exited: 0 };
  runnerPool.attachProcessChangedSink((change: Parameters<ProcessChangedSink>[0]) => {
    processes[change.state] += 1;
    log.info({ change }, "runner process changed");
    bus.publish("daemon:processes", { type: "process_changed", ...change });
  });
  runnerPool.attachProviderUsageSink((report) => recordUsage(report));
  const steering = { settled: 0 };
  runnerPool.attachSteerSettledSink((settled) => {
    steering.settled += settled.count;
    bus.publish(`session:${settled.sessionId}`, { type: "steer_settled", ...settled });
  });

  const publishDelivery = async (delivery: DeliveryNotice): Promise<DeliveryNotice | null> => {
    // The acknowledgement is only as true as the journal: re-read the durable proof (settled, undiscarded
    // rows carrying details.resultId) and fan out only what it confirms.
    const principal = await sessionPrincipal(pgPool, delivery.parentSessionId);
    if (principal === null) return null;
    const settled = new Set(await repo.settledResultIds(delivery.parentSessionId, principal));
    const results = delivery.results.filter((r) => settled.has(r.resultId));
    if (results.length < delivery.results.length)
      log.warn(
        { parentSessionId: delivery.parentSessionId, unconfirmed: delivery.results.length - results.length },
        "result delivery not confirmed by the journal; not published",
      );
    if (results.length === 0) return null;
    const notice = { parentSessionId: delivery.parentSessionId, results };
    bus.publish(`session:${delivery.parentSessionId}`, { type: "result_delivered", ...notice });
    return notice;
  };
  // A runner's delegation.resultDelivered (accepted by the pool only from the parent's routed runner) reaches
  // the same publisher; the host call answers after publication.
  runnerPool.attachResultDeliveredSink(async (delivery) => {
    await publishDelivery(delivery);
  });
  // Working directories are real paths: the data directory and its worktrees are compared as real paths too.
  const realDataDir = realpathSync(config.dataDir);
  const worktreesDir = join(realDataDir, "worktrees");
  const service: DelegationService = new DelegationService({
    repo,
    // One whole-catalog deferral policy for every session and both placements (runner or daemon).
    runner: withToolCatalog(dispatch, catalogPolicy),
    spill: new FileSpillStore(join(config.dataDir, "spill")),
    owner,
    stallAfterMs: config.stallAfterMs,
    projects: projectRegistry(repo),
    worktreesDir,
    hostPrivate: [{ path: realDataDir, agentsMayUse: [worktreesDir] }],
    tools: (session) => [
      ...workflowTools({
        service,
        engine,
        session,
        readOnly: false,
        // a definition is read from the session's own project, never from where the daemon was started
        reader: sessionProjectFileReader(() => service.projectFilesOf(session)),
        currentWorkDir: async () => (await service.placeUnder(session, undefined))?.workDir ?? null,
        expansionAvailable: delegatedWorkflowExpansionAvailable(
          session.kind === "root" ? "in-process" : dispatch.placement(),
          runnerPool,
        ),
      }),
      ...mcp.tools(),
    ],
    onEvent: (event) => {
      log.info({ event }, "delegation event");
      if ("parentSessionId" in event && event.parentSessionId)
        bus.publish(`session:${event.parentSessionId}`, event);
    },
    onResultDelivered: async (event) => {
      await publishDelivery({ parentSessionId: event.parentSessionId, results: event.delivered });
    },
  });
  const nodeDispatcher = new JournalNodeDispatcher(repo, delegationNodeTurns(service));
  engine = new WorkflowEngine({
    pool: pgPool,
    // The engine holds its own owner lease: two advisory locks on one key would wait on each other.
    owner: `${owner}-workflows`,
    dispatcher: nodeDispatcher,
    worktreesDir,
    // A node's `cwd` is placed under the live policy of the session that started its workflow.
    workDirPolicy: async (journal) =>
      service.workDirPolicyOf(await repo.getSession(journal.parentSessionId, journal.principalAccountId)),
    admitNodeWorkDir: async (journal, placement) =>
      service.assertInsideProjectOf(
        await repo.getSession(journal.parentSessionId, journal.principalAccountId),
        placement,
      ),
    defaultModel: config.models.default,
    repo,
    ...(config.runtime.maxActiveNodes !== undefined && { maxActiveNodes: config.runtime.maxActiveNodes }),
    // A cancel recorded by another daemon for a workflow this one drives reaches it through pg_notify.
    listenForCancel: true,
    onCompletion: (c) => service.workflowSummaryQueued(c.parentSessionId, c.principalAccountId, c.resultId),
    // A workflow finished after a restart has no live origin: its summary is prepared the same way.
    summaryWriter: (origin) => (summary, outcome, workflowId) =>
      service.prepareWorkflowSummary(
        { sessionId: origin.parentSessionId, principalAccountId: origin.principalAccountId },
        workflowId,
        summary,
        outcome,
      ),
    onEvent: (event: WorkflowEvent) => {
      log.info({ event }, "workflow event");
      bus.publish(`workflow:${event.workflowId}`, event);
    },
  });

  let recovery: BootRecovery | null = null;
  const takeOver = (work: OrphanedWork) =>
    takeOverPass(work, { service, engine, nodeDispatcher, maxRecoveryAttempts: config.maxRecoveryAttempts });
  let sweep: TakeoverSweep | undefined;
  let releases: { close(): Promise<void> } | undefined;
  // Bounded: a pass stuck on a hung database must not keep a stopping daemon from its checkpoint.
  const stopTakeover = async () => {
    const listener = releases;
    releases = undefined;
    await within(Promise.all([listener?.close(), sweep?.stop()]), 5_000);
  };
  const progressSink =
    (extra?: ProgressSink): ProgressSink =>
    (event: ProgressEvent) => {
      bus.publish(`session:${event.sessionId}`, { type: "progress", event });
      extra?.(event);
    };

  const executionFor = (sessionId: string): ExecutionLocation => {
    if (inProcessTurns.has(sessionId)) return { location: "in-process", state: "running" };
    const routed = runnerPool.executionOf(sessionId);
    return routed ? { location: "runner", ...routed } : { location: "none" };
  };

  const executions = (): ({ sessionId: string } & ExecutionLocation)[] => {
    const ids = new Set([...inProcessTurns.keys(), ...runnerPool.executions().map((e) => e.sessionId)]);
    return [...ids].map((sessionId) => ({ sessionId, ...executionFor(sessionId) }));
  };

  // A result queued by this process wakes a client's take here at once; another process's, through NOTIFY.
  service.notifier.listen((sessionId) => wake.wake(inboxWakeKey(sessionId)));
  // Last: a start that failed above leaves no listening connection holding the pool (and the process) open.
  wake.attach(pgPool, (e) => log.warn({ err: e }, "wake listener failed; it reconnects"));
  return {
    repo,
    service,
    engine,
    runnerPool,
    alerts,
    bus,
    wake,
    placements,
    progressSink,
    executionFor,
    executions,
    publishDelivery,
    async recover() {
      const startedAt = new Date().toISOString();
      recovery = {
        startedAt,
        finishedAt: null,
        delegations: null,
        workflows: null,
        firstTurnAt: null,
        error: null,
      };
      // Another daemon of the database is live: its in-flight journals, fork copies and runs it has not
      // leased yet are its own. Only dead owners' work is recovered, as a live takeover does.
      if (await repo.otherOwnersLive([owner])) {
        await service.start();
        await engine.open();
        const pass = await takeOver({ runs: true, workflows: true });
        const w = pass.workflows;
        const done: BootRecovery = {
          ...recovery,
          delegations: { discardedForks: [], ...pass.delegations },
          workflows: { resumed: [...w.resumed], invalid: [...w.invalid], refused: [...w.refused] },
          finishedAt: new Date().toISOString(),
        };
        recovery = done;
        log.info({ peersLive: true, ...counts(pass) }, "boot recovery took the work of dead daemons only");
        return done;
      }
      await wake.aloneOnDatabase();
      // Delegations first: it settles every interrupted journal tail (node children's included) before a
      // workflow node is continued from its journal.
      const delegations = await recoverDelegations(service, {
        maxRecoveryAttempts: config.maxRecoveryAttempts,
      });
      await engine.open();
      const workflows = await engine.recoverInterrupted();
      recovery = { ...recovery, delegations, workflows, finishedAt: new Date().toISOString() };
      log.info(
        {
          continued: delegations.continued.length,
          settled: delegations.settledWithoutTurn.length,
          terminalized: delegations.terminalized.length,
          failed: delegations.failed.length,
          unknownToolCalls: delegations.unknownToolCalls,
          workflowsResumed: workflows.resumed.length,
          workflowsInvalid: workflows.invalid.length,
        },
        "boot recovery claimed its work",
      );
      return recovery;
    },
    takeOver,
    async startTakeover() {
      if (sweep || config.runtime.takeoverSweepMs <= 0) return;
      const s = startTakeoverSweep({
        intervalMs: config.runtime.takeoverSweepMs,
        probe: () => repo.orphanedWork(),
        pass: takeOver,
        log: log.child({ part: "takeover" }),
      });
      sweep = s;
      releases = await listenForOwnerReleases(
        pgPool,
        (owner) => s.released(owner),
        // (Again) listening: a release sent while the connection was down is caught by a check now.
        () => s.wake(),
        (e) => log.warn({ err: e }, "takeover listener failed; it reconnects"),
      );
    },
    stopTakeover,
    pendingCalls: () => tracked.pending(),
    health() {
      return {
        pool: runnerPool.health(),
        mcp: {
          servers: mcp.servers().map((s) => ({
            name: s.name,
            tools: s.tools.length,
            running: s.running,
            state: s.state,
            restarts: s.restarts,
            attempts: s.attempts,
            lastError: s.lastError,
          })),
        },
        recovery: recovery ? { ...recovery, firstTurnAt } : null,
        takeover: sweep?.health() ?? null,
        workflows: { driving: engine.runIds().length },
        executions: executions(),
        processes: { ...processes },
        steering: { ...steering },
        providerUsage: { ...usage },
      };
    },
    pause: () => service.pauseForRestart(),
    async close(options = {}) {
      const abandon = options.abandonCheckpoint === true;
      // The wake listener holds a pool connection: let go of it before the pool ends.
      await within(wake.close(), 2_000);
      // Abandoned (a checkpoint past its deadline, a lost database or lease): no new statement of this
      // runtime reaches the rows from here on, whatever still runs; the ones in flight complete.
      const endPool = () =>
        pgPool.end().catch((e: unknown) => log.warn({ err: e }, "database pool end failed"));
      const early = abandon ? endPool() : undefined;
      // Nothing is taken over by a daemon on its way out.
      await stopTakeover();
      // The checkpoint first (close after a failed one still stops everything; the caller reports it). A
      // checkpoint past its deadline is abandoned: its blocked writes are left to the database and to the
      // next boot's recovery, and no part waits for them beyond a short bound.
      if (!abandon) await service.pauseForRestart().catch(() => {});
      const bound = (work: Promise<unknown>) => (abandon ? within(work, config.abandonedCloseMs) : work);
      // New statements are refused from here on; the ones in flight complete (the journal writes drain).
      const ended = early ?? endPool();
      await bound(runnerPool.close().catch((e: unknown) => log.warn({ err: e }, "runner pool close failed")));
      log.info({}, "runner pool closed");
      await bound(engine.close().catch((e: unknown) => log.warn({ err: e }, "workflow engine close failed")));
      await bound(
        service.close().catch((e: unknown) => log.warn({ err: e }, "delegation service close failed")),
      );
      await mcp.close().catch((e: unknown) => log.warn({ err: e }, "MCP servers close failed"));
      await bound(ended);
    },
  };
}

/**
 * One live takeover pass (see DaemonRuntime.takeOver). Workflows first: boot recovery takes delegations first
 * so that every journal tail is settled before a node continues, and here each node child's tail is settled
 * just before its node continues instead, so a dead peer's few workflow nodes need not queue behind its many
 * delegated calls. A taken workflow's root parent has its interrupted tail settled before anything resumes.
 * Root parents with queued results get their follow-up turn here, as after a boot; a taken child that
 * settles later wakes its parent here through the ordinary delivery path.
 */
const counts = (p: TakeoverPass) => ({
  continued: p.delegations.continued.length,
  settled: p.delegations.settledWithoutTurn.length,
  terminalized: p.delegations.terminalized.length,
  failed: p.delegations.failed.length,
  workflowsResumed: p.workflows.resumed.length,
});

async function takeOverPass(
  work: OrphanedWork,
  deps: {
    service: DelegationService;
    engine: WorkflowEngine;
    nodeDispatcher: JournalNodeDispatcher;
    maxRecoveryAttempts: number;
  },
): Promise<TakeoverPass> {
  const { service, engine, nodeDispatcher } = deps;
  let roots: SessionRow[] = [];
  const workflows =
    work.workflows && !service.paused
      ? await engine.recoverInterrupted(1000, {
          deadOwnersOnly: true,
          claimed: async (rows) => {
            roots = await idleRootParents(service, rows);
            await settleInterruptedTails(
              service,
              roots.map((r) => r.id),
            );
          },
          continueNode: async (input, host) => {
            if (typeof input.childSessionId === "string")
              await settleInterruptedTails(service, [input.childSessionId]);
            return nodeDispatcher.continueNode(input, host);
          },
        })
      : { resumed: [], invalid: [], refused: [] };
  await followUpQueued(service, roots);
  const delegations = work.runs
    ? await takeOverDelegations(service, { maxRecoveryAttempts: deps.maxRecoveryAttempts })
    : {
        continued: [],
        settledWithoutTurn: [],
        terminalized: [],
        failed: [],
        unknownToolCalls: 0,
        roots: [],
        handedBack: [],
      };
  const served = new Set([...roots.map((r) => r.id), ...delegations.roots]);
  return { delegations: { ...delegations, roots: [...served] }, workflows };
}
