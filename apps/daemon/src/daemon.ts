import {
  listenForRevocations,
  migrate,
  PgDelegationRepository,
  pingDatabase,
  type RevocationListener,
} from "@crw/db";
import type pg from "pg";
import { type Logger, pino } from "pino";
import { z } from "zod";
import { registerAccountMethods } from "./api/accounts.js";
import { registerClientSessionMethods } from "./api/clientSessions.js";
import { healthFor } from "./api/health.js";
import { registerProjectMethods } from "./api/projects.js";
import { registerSessionMethods } from "./api/sessions.js";
import { registerWorkflowMethods } from "./api/workflows.js";
import type { DaemonConfig } from "./config.js";
import { type DaemonState, lockDataDir, privateDataDir, removeState, writeState } from "./lifecycle.js";
import { ensureOwnerToken, tokenHash } from "./ownerToken.js";
import { type DaemonDatabase, openDaemonDatabase } from "./postgres.js";
import { databaseUnavailable, errorFrame, type RpcError, type RpcRegistry } from "./rpc.js";
import type { DaemonRuntime, PendingCall, TurnObserver } from "./runtime.js";
import { daemonPool, RuntimeCycle } from "./runtimeCycle.js";
import { type ApiServer, startApiServer } from "./server.js";

export type DaemonPhase = "starting" | "recovering" | "ready" | "stopping" | "stopped";

export interface StopOutcome {
  readonly reason: string;
  readonly checkpoint: "passed" | "failed";
  /** Set when the checkpoint did not finish within `shutdownCheckpointMs`: the calls it still waited for. */
  readonly pending?: readonly PendingCall[];
}

export interface Daemon {
  readonly config: DaemonConfig;
  readonly state: DaemonState;
  readonly rpc: RpcRegistry;
  readonly log: Logger;
  readonly runtime: DaemonRuntime;
  phase(): DaemonPhase;
  /** Graceful stop: refuse new work, let in-flight requests finish (bounded by shutdownGraceMs), close. */
  stop(reason?: string): Promise<void>;
  /**
   * Resolves once the daemon has stopped, however it stopped: `checkpoint` says whether the restart
   * checkpoint drained every captured journal write (a failed one means the process should exit nonzero).
   */
  readonly stopped: Promise<StopOutcome>;
}

export interface StartDaemonOptions {
  log?: Logger;
  /** Install SIGTERM/SIGINT handlers that stop the daemon (the process entry does; embedders may not). */
  handleSignals?: boolean;
  /** Sees every turn request with its placement before it runs (the parity suite's capture seam). */
  observeTurn?: TurnObserver;
}

/**
 * Start order: lock the data directory, open PostgreSQL (embedded by default), migrate, make sure an owner
 * token exists, recover, then listen. Nothing is accepted before recovery: the API port is not open yet.
 */
export async function startDaemon(config: DaemonConfig, options: StartDaemonOptions = {}): Promise<Daemon> {
  const log = options.log ?? pino({ level: config.logLevel, base: { pid: process.pid } });
  let phase: DaemonPhase = "starting";
  const startedAt = new Date();
  for (const n of await privateDataDir(config.dataDir))
    log.warn({ path: n.path, from: n.from, to: n.to }, "data directory mode narrowed");
  const unlock = await lockDataDir(config.dataDir);
  let db: DaemonDatabase | undefined;
  let control: pg.Pool | undefined;
  let cycle: RuntimeCycle | undefined;
  let server: ApiServer | undefined;
  let revocations: RevocationListener | undefined;
  const cleanup = async (abandonCheckpoint = false) => {
    await server?.close().catch((e: unknown) => log.warn({ err: e }, "api close failed"));
    await revocations
      ?.close()
      .catch((e: unknown) => log.warn({ err: e }, "revocation listener close failed"));
    if (cycle) {
      await cycle.stop();
      await cycle.current.rt.close({ abandonCheckpoint });
    }
    await control?.end().catch((e: unknown) => log.warn({ err: e }, "pool end failed"));
    await db?.stop().catch((e: unknown) => log.warn({ err: e }, "database stop failed"));
    await removeState(config.dataDir);
    await unlock();
  };
  try {
    db = await openDaemonDatabase(config, (msg, fields) => log.info(fields ?? {}, msg));
    const ran = await migrateShared(db.url, log);
    log.info({ ran, database: db.kind }, "migrations applied");
    // Accounts, tokens and the database probes live on a pool of their own: a runtime's pool ends with it
    // when the database is lost, and a request must still be authenticated (and refused) meanwhile.
    control = daemonPool(db.url, 4, log);
    const accounts = new PgDelegationRepository(control);
    await ensureOwnerToken(accounts, config.dataDir);

    const inFlight = new Set<Promise<unknown>>();
    const stopSignal = new AbortController();
    const dbKind = db.kind;
    const controlPool = control;
    const health = async () => {
      // called only once the first runtime has booted (by its API methods and the server)
      const c = cycle as RuntimeCycle;
      const rt = c.current.rt;
      const started = Date.now();
      const failed = await pingDatabase(controlPool, 2_000);
      if (failed) c.watch.suspect();
      const database = {
        kind: dbKind,
        ...c.watch.health(),
        ok: !failed && c.available,
        ...(failed ? { error: failed.message } : { latencyMs: Date.now() - started }),
        recovery: c.health(),
      };
      return {
        // a daemon whose database does not answer (or whose runtime is being replaced) is degraded
        status: phase === "ready" ? (database.ok ? "ok" : "degraded") : phase,
        phase,
        pid: process.pid,
        uptimeSeconds: Math.round((Date.now() - startedAt.getTime()) / 1000),
        database,
        runtime: { subagentRunnerEnabled: config.runtime.subagentRunnerEnabled },
        ...rt.health(),
        placements: { ...rt.placements },
        alerts: rt.alerts.list(),
      };
    };
    const methods = (rpc: RpcRegistry, rt: DaemonRuntime) => {
      rpc.register("daemon.health", {
        params: z.object({}).strict(),
        handler: async (_p, ctx) => healthFor(rt, ctx.accountId, await health()),
      });
      rpc.register("daemon.whoami", {
        params: z.object({}).strict(),
        handler: async (_p, ctx) => {
          const account = await rt.repo.getAccount(ctx.accountId);
          return {
            accountId: account.id,
            name: account.name,
            isOwner: account.isOwner,
            isAdministrator: account.isAdministrator,
          };
        },
      });
      registerSessionMethods(rpc, rt, config.models.default);
      registerClientSessionMethods(rpc, rt, config.models.default);
      registerWorkflowMethods(rpc, rt, config.models.default);
      registerProjectMethods(rpc, rt);
      registerAccountMethods(rpc, rt);
    };

    // Boot recovery of delegations and workflows, before the port opens: nothing is accepted until every
    // interrupted call and workflow is claimed and on its way.
    phase = "recovering";
    cycle = await RuntimeCycle.boot(
      { config, db, log, ...(options.observeTurn && { observeTurn: options.observeTurn }), methods },
      control,
    );
    const c = cycle;
    phase = "ready";

    server = await startApiServer({
      host: config.host,
      port: config.port,
      handle: (frame, ctx) => {
        if (phase !== "ready") return Promise.resolve(refusedWhileStopping(frame));
        if (!c.available) return Promise.resolve(refused(frame, databaseUnavailable()));
        // Long calls (tap, follow) end when the daemon stops as when their connection closes.
        const p = c.current.rpc.handle(frame, {
          ...ctx,
          signal: AbortSignal.any([ctx.signal, stopSignal.signal]),
        });
        inFlight.add(p);
        p.finally(() => inFlight.delete(p)).catch(() => undefined);
        return p.then((reply) => {
          if (errorCodeOf(reply) === "database_unavailable") c.watch.suspect();
          return reply;
        });
      },
      authenticate: async (token) => {
        const account = await accounts.accountByTokenHash(tokenHash(token));
        return account ? { accountId: account.id } : undefined;
      },
      health,
      healthFor: (accountId, doc) => healthFor(c.current.rt, accountId, doc),
      log,
    });
    revocations = await watchRevocations(accounts, control, server, log);
    const state: DaemonState = {
      pid: process.pid,
      host: config.host,
      port: server.port,
      url: `http://${config.host}:${server.port}`,
      startedAt: startedAt.toISOString(),
      database: db.kind,
    };
    await writeState(config.dataDir, state);
    log.info({ url: state.url, dataDir: config.dataDir }, "daemon ready");

    let resolveStopped: (outcome: StopOutcome) => void = () => {};
    const stopped = new Promise<StopOutcome>((r) => {
      resolveStopped = r;
    });
    let stopping: Promise<void> | undefined;
    const stop = (reason = "requested") => {
      stopping ??= (async () => {
        phase = "stopping";
        stopSignal.abort();
        log.info({ reason, inFlight: inFlight.size }, "daemon stopping");
        // A stopping daemon recovers and takes over nothing more (a running pass ends first).
        await c.stop();
        const rt = c.current.rt;
        await rt.stopTakeover();
        // The restart checkpoint before anything closes: captured journal writes and publications commit
        // (a finished tool result queued behind an in-flight write included) while the database pool still
        // accepts statements; model and tool turns are not waited for: boot recovery continues them.
        let checkpoint: StopOutcome["checkpoint"] = "passed";
        let pending: PendingCall[] | undefined;
        // The checkpoint is bounded: a journal write blocked for good (a lock held elsewhere, a hung
        // database) must not keep the daemon in "stopping". Past the deadline the stop fails, naming what
        // was still pending; nothing committed is touched and boot recovery continues from the rows.
        let deadline: NodeJS.Timeout | undefined;
        const timedOut = new Promise<"timeout">((r) => {
          deadline = setTimeout(() => r("timeout"), config.shutdownCheckpointMs);
        });
        try {
          const result = await Promise.race([rt.pause().then(() => "done" as const), timedOut]);
          if (result === "timeout") {
            checkpoint = "failed";
            pending = rt.pendingCalls();
            log.error(
              { pending, deadlineMs: config.shutdownCheckpointMs },
              `shutdown failed: the restart checkpoint did not finish within ${config.shutdownCheckpointMs} ms; still pending: ${describePending(pending)}; boot recovery continues from the committed rows`,
            );
          } else log.info({}, "shutdown checkpoint passed");
        } catch (e) {
          checkpoint = "failed";
          log.error(
            { err: e },
            "shutdown failed: the restart checkpoint could not commit its journal writes",
          );
        } finally {
          clearTimeout(deadline);
        }
        // In-flight API requests get the grace period (none past a checkpoint deadline: they wait on the same
        // database); what is still running after it stays in the rows for the next boot's recovery.
        const graceMs = pending ? 0 : config.shutdownGraceMs;
        const grace = new Promise((r) => setTimeout(r, graceMs).unref());
        await Promise.race([Promise.allSettled([...inFlight]), grace]);
        await cleanup(pending !== undefined);
        phase = "stopped";
        log.info({ checkpoint }, "daemon stopped");
        // The process entry exits nonzero after a failed checkpoint. Past the deadline a blocked write
        // still holds its database connection open, so the process ends here rather than waiting on it.
        if (checkpoint === "failed" && options.handleSignals) {
          process.exitCode = 1;
          if (pending) setImmediate(() => process.exit(1));
        }
        resolveStopped({ reason, checkpoint, ...(pending && { pending }) });
      })();
      return stopping;
    };
    if (options.handleSignals) {
      for (const signal of ["SIGTERM", "SIGINT"] as const) process.once(signal, () => void stop(signal));
    }
    return {
      config,
      state,
      log,
      get rpc() {
        return c.current.rpc;
      },
      get runtime() {
        return c.current.rt;
      },
      phase: () => phase,
      stop,
      stopped,
    };
  } catch (e) {
    log.error({ err: e }, "daemon failed to start");
    await cleanup();
    throw e;
  }
}

/**
 * A token revoked on any daemon of the database closes the connections this one opened with it, at once
 * (a notification on commit). Each time the listener is in place again after a lost connection, the open
 * connections' tokens are checked, so a revocation missed meanwhile still closes them.
 */
async function watchRevocations(
  repo: PgDelegationRepository,
  pool: pg.Pool,
  server: ApiServer,
  log: Logger,
): Promise<RevocationListener> {
  const recheck = async () => {
    for (const hash of await repo.unusableTokenHashes(server.openTokens()))
      server.dropToken(hash.toString("hex"));
  };
  return listenForRevocations(
    pool,
    (hashHex) => server.dropToken(hashHex),
    () => void recheck().catch((e: unknown) => log.warn({ err: e }, "token re-check failed")),
    (e) => log.warn({ err: e }, "revocation listener connection failed; listening again"),
  );
}

/**
 * Migrations when several daemons share one PostgreSQL and boot together: node-pg-migrate holds an advisory
 * lock and refuses a second runner at once (it throws a plain Error, so its text is all there is to match);
 * the later daemon waits for the first to finish, bounded, then migrates (finding nothing left to do).
 */
async function migrateShared(url: string, log: Logger): Promise<unknown> {
  const until = Date.now() + 60_000;
  for (let delay = 100; ; delay = Math.min(delay * 2, 2_000)) {
    try {
      return await migrate(url);
    } catch (e) {
      const busy = e instanceof Error && /another migration is already running/i.test(e.message);
      if (!busy || Date.now() > until) throw e;
      log.info({ delayMs: delay }, "another daemon is migrating; waiting");
      await new Promise((r) => setTimeout(r, delay));
    }
  }
}

function describePending(pending: readonly PendingCall[]): string {
  if (pending.length === 0) return "no database call (a captured write had not reached the database)";
  return pending
    .map((p) => `${p.call}${p.sessionId ? ` (session ${p.sessionId})` : ""} for ${p.sinceMs} ms`)
    .join(", ");
}

function refused(frame: unknown, e: RpcError): object | undefined {
  const id = (frame as { id?: unknown })?.id;
  return typeof id === "string" || typeof id === "number" ? errorFrame(id, e) : undefined;
}

const errorCodeOf = (reply: object | undefined): string | undefined =>
  (reply as { error?: { data?: { code?: string } } } | undefined)?.error?.data?.code;

function refusedWhileStopping(frame: unknown): object | undefined {
  const id = (frame as { id?: unknown })?.id;
  if (typeof id !== "string" && typeof id !== "number") return undefined;
  return {
    jsonrpc: "2.0",
    id,
    error: {
      code: -32000,
      message: "the daemon is stopping",
      data: { name: "DaemonStoppingError", code: "daemon_stopping" },
    },
  };
}
