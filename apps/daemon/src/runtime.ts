import { randomUUID } from "node:crypto";
import { cpus } from "node:os";
import { join } from "node:path";
import {
  createAgentTurnRunner,
  DelegationService,
  FileSpillStore,
  type ProgressEvent,
  type ProgressSink,
  type RecoveryReport,
  recoverDelegations,
  type TurnRequest,
} from "@crw/brain";
import { PgDelegationRepository } from "@crw/db";
import {
  boundedProjectFileReader,
  delegationNodeTurns,
  JournalNodeDispatcher,
  WorkflowEngine,
  type WorkflowEvent,
  workflowTools,
} from "@crw/plugin-subagent";
import {
  killContainedProcesses,
  MemoryRetryPolicySource,
  type PoolHealth,
  RESTART_REQUIRED_ALERT_KEY,
  SubagentRunnerPool,
  SubagentSessionDispatch,
} from "@crw/subagent";
import type pg from "pg";
import type { Logger } from "pino";
import { AlertService } from "./alerts.js";
import type { DaemonConfig } from "./config.js";
import { EventBus } from "./events.js";

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

export type TurnObserver = (request: TurnRequest, placement: "runner" | "in-process") => void;

export interface DaemonRuntime {
  readonly repo: PgDelegationRepository;
  readonly service: DelegationService;
  readonly engine: WorkflowEngine;
  readonly runnerPool: SubagentRunnerPool;
  readonly alerts: AlertService;
  readonly bus: EventBus;
  /** Placement counts since start: how many turns ran in runners and in the daemon. */
  readonly placements: { runner: number; "in-process": number };
  /** A progress sink that publishes to the live views of each event's session. */
  progressSink(extra?: ProgressSink): ProgressSink;
  /** Boot recovery of delegations, then workflows; runs before the API port opens. */
  recover(): Promise<BootRecovery>;
  health(): { pool: PoolHealth; recovery: BootRecovery | null; workflows: { driving: number } };
  /**
   * Graceful stop: the database pool stops taking new statements and finishes those in flight (journal
   * writes drain); then runners, the workflow engine and the delegation core let go. Interrupted turns are
   * left to the next boot's recovery, never settled as failures by the shutdown itself.
   */
  close(): Promise<void>;
}

/** The daemon's parts wired together: db + brain (delegation core, agent loop) + runner pool + the Sub-agent plugin. */
export async function assembleRuntime(
  config: DaemonConfig,
  pgPool: pg.Pool,
  log: Logger,
  observeTurn?: TurnObserver,
): Promise<DaemonRuntime> {
  const repo = new PgDelegationRepository(pgPool);
  const bus = new EventBus();
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
  const runnerPool = new SubagentRunnerPool({
    sizing: () => ({ maxRunners, turnsPerRunner: config.runtime.turnsPerRunner }),
    enabled: () => config.runtime.subagentRunnerEnabled,
    retryPolicySource: () => policy,
    catalog: () => ({
      revision: 1,
      public: [{ id: config.models.default, provider: config.models.default.split(":")[0] ?? "scripted" }],
      accounts: {},
    }),
    // Runners build their agent loop with the same provider settings as the daemon's own.
    agentOptions: () => ({ baseUrls: config.models.baseUrls, apiKeyEnv: config.models.apiKeyEnv }),
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

  const placements = { runner: 0, "in-process": 0 };
  let firstTurnAt: string | null = null;
  const catalog = { baseUrls: config.models.baseUrls, apiKeyEnv: config.models.apiKeyEnv };
  const dispatch = new SubagentSessionDispatch({
    pool: runnerPool,
    inProcess: createAgentTurnRunner(catalog),
    runnerEnabled: () => config.runtime.subagentRunnerEnabled,
    runnerKind: "agent",
    onPlaced: (request, placement) => {
      placements[placement] += 1;
      observeTurn?.(request, placement);
      firstTurnAt ??= new Date().toISOString();
    },
    // A child's channel (fairness key, unit of abort) is its parent session, read from its row.
    placementOf: async (request) => {
      const row = await repo.getSession(request.sessionId, request.principalAccountId);
      return row.parentSessionId
        ? { channelId: row.parentSessionId, parentSessionId: row.parentSessionId }
        : { channelId: row.id };
    },
  });

  const reader = boundedProjectFileReader({ root: config.projectRoot });
  let engine!: WorkflowEngine;
  const service: DelegationService = new DelegationService({
    repo,
    runner: dispatch,
    spill: new FileSpillStore(join(config.dataDir, "spill")),
    owner,
    tools: (session) =>
      workflowTools({
        service,
        engine,
        session,
        readOnly: false,
        reader,
        currentWorkDir: async () => null,
      }),
    onEvent: (event) => {
      log.info({ event }, "delegation event");
      if ("parentSessionId" in event && event.parentSessionId)
        bus.publish(`session:${event.parentSessionId}`, event);
    },
    onResultDelivered: (event) => {
      bus.publish(`session:${event.parentSessionId}`, { type: "result_delivered", ...event });
    },
  });
  engine = new WorkflowEngine({
    pool: pgPool,
    // The engine holds its own owner lease: two advisory locks on one key would wait on each other.
    owner: `${owner}-workflows`,
    dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
    defaultModel: config.models.default,
    repo,
    // A cancel recorded by another daemon for a workflow this one drives reaches it through pg_notify.
    listenForCancel: true,
    onCompletion: (c) => service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
    onEvent: (event: WorkflowEvent) => {
      log.info({ event }, "workflow event");
      bus.publish(`workflow:${event.workflowId}`, event);
    },
  });

  let recovery: BootRecovery | null = null;
  const progressSink =
    (extra?: ProgressSink): ProgressSink =>
    (event: ProgressEvent) => {
      bus.publish(`session:${event.sessionId}`, { type: "progress", event });
      extra?.(event);
    };

  return {
    repo,
    service,
    engine,
    runnerPool,
    alerts,
    bus,
    placements,
    progressSink,
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
    health() {
      return {
        pool: runnerPool.health(),
        recovery: recovery ? { ...recovery, firstTurnAt } : null,
        workflows: { driving: engine.runIds().length },
      };
    },
    async close() {
      // New statements are refused from here on; the ones in flight complete (the journal writes drain).
      const ended = pgPool.end().catch((e: unknown) => log.warn({ err: e }, "database pool end failed"));
      await runnerPool.close().catch((e: unknown) => log.warn({ err: e }, "runner pool close failed"));
      await engine.close().catch((e: unknown) => log.warn({ err: e }, "workflow engine close failed"));
      await service.close().catch((e: unknown) => log.warn({ err: e }, "delegation service close failed"));
      await ended;
    },
  };
}
