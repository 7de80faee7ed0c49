import { createPool } from "@crw/db";
import type pg from "pg";
import type { Logger } from "pino";
import type { DaemonConfig } from "./config.js";
import { DatabaseWatch } from "./databaseWatch.js";
import type { DaemonDatabase } from "./postgres.js";
import { RpcRegistry } from "./rpc.js";
import { assembleRuntime, type DaemonRuntime, type TurnObserver } from "./runtime.js";

/** A pool whose failed connections are logged, never fatal to the process. */
export function daemonPool(url: string, max: number, log: Logger): pg.Pool {
  const pool = createPool({ connectionString: url, max });
  pool.on("error", (e) => log.warn({ err: e }, "idle database client failed"));
  // A checked-out client whose connection the server ends (restart, pg_terminate_backend) emits 'error'
  // besides failing its query: the query's caller handles the failure; the event must not end the process.
  pool.on("connect", (client) => {
    client.on("error", (e) => log.warn({ err: e }, "database connection ended"));
  });
  return pool;
}

/** One runtime with its own pool and the API methods bound to it. */
export interface RuntimeGeneration {
  readonly n: number;
  readonly rt: DaemonRuntime;
  readonly rpc: RpcRegistry;
}

/** What the daemon did when it lost its database or its owner lease, as /health shows it. */
export interface RecoveryCycleHealth {
  /** Runtimes started again in this process since it started. */
  readonly recoveries: number;
  readonly recovering: boolean;
  readonly last: { readonly reason: string; readonly at: string; readonly ms: number | null } | null;
}

export interface RuntimeCycleOptions {
  readonly config: DaemonConfig;
  readonly db: DaemonDatabase;
  readonly log: Logger;
  readonly observeTurn?: TurnObserver;
  /** Registers the API methods of one runtime. */
  readonly methods: (rpc: RpcRegistry, rt: DaemonRuntime) => void;
}

/**
 * How long the replaced runtime's close is waited for before the new one boots: its pool is ended first,
 * so nothing more of it reaches the rows; what is left (runners ending their turns) finishes meanwhile.
 */
const TEARDOWN_MS = 2_000;
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());

/**
 * The daemon's runtime across database losses. A runtime whose database went away (or whose owner lease's
 * connection failed, so peers may already be claiming its work) cannot be trusted to go on: it is closed
 * as at a stop whose checkpoint is abandoned (nothing more reaches the rows from it: its pool is ended),
 * and once the database answers a new runtime boots on a new pool and runs boot recovery for the work
 * its predecessor left, exactly as a restart of the process would. In between, requests are refused.
 */
export class RuntimeCycle {
  #current: RuntimeGeneration;
  #restarting: Promise<void> | undefined;
  #stopped = false;
  #recoveries = 0;
  #last: { reason: string; at: string; ms: number | null } | null = null;
  readonly watch: DatabaseWatch;

  private constructor(
    private readonly options: RuntimeCycleOptions,
    controlPool: pg.Pool,
    first: RuntimeGeneration,
  ) {
    this.#current = first;
    this.watch = new DatabaseWatch({
      pool: controlPool,
      db: options.db,
      log: options.log,
      retryMaxMs: options.config.runtime.databaseRetryMaxMs,
      onLost: (cause) => void this.restart(`the database stopped answering: ${cause.message}`),
    });
  }

  /** The first runtime: assembled, recovered and taking over dead peers' work, then the watch starts. */
  static async boot(options: RuntimeCycleOptions, controlPool: pg.Pool): Promise<RuntimeCycle> {
    let cycle: RuntimeCycle | undefined;
    const first = await bootGeneration(options, 1, (n, reason) => cycle?.leaseLost(n, reason));
    cycle = new RuntimeCycle(options, controlPool, first);
    cycle.watch.start();
    return cycle;
  }

  get current(): RuntimeGeneration {
    return this.#current;
  }

  /** Whether requests may run now: the database answers and no runtime is being replaced. */
  get available(): boolean {
    return this.watch.available && !this.#restarting;
  }

  health(): RecoveryCycleHealth {
    return { recoveries: this.#recoveries, recovering: Boolean(this.#restarting), last: this.#last };
  }

  /** A lease of generation `n` was lost: only the current generation's loss restarts anything. */
  leaseLost(n: number, reason: string): void {
    if (n === this.#current.n) void this.restart(reason);
  }

  /** Closes the current runtime and boots a new one once the database answers (one at a time). */
  restart(reason: string): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    this.#restarting ??= this.#replace(reason).finally(() => {
      this.#restarting = undefined;
    });
    return this.#restarting;
  }

  /** No runtime boots after this; a replacement under way is given a short bound to end. */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.watch.stop();
    await Promise.race([this.#restarting, pause(5_000)]);
  }

  async #replace(reason: string): Promise<void> {
    const { log } = this.options;
    const t0 = Date.now();
    this.#last = { reason, at: new Date().toISOString(), ms: null };
    log.error({ reason }, "the runtime can no longer trust its database connection: closing it to recover");
    this.watch.suspect();
    const old = this.#current;
    await Promise.race([
      old.rt
        .close({ abandonCheckpoint: true })
        .catch((e: unknown) => log.warn({ err: e }, "closing the old runtime failed")),
      pause(TEARDOWN_MS),
    ]);
    for (let delay = 250; !this.#stopped; delay = Math.min(delay * 2, 5_000)) {
      await this.watch.answering();
      if (this.#stopped) return;
      try {
        this.#current = await bootGeneration(this.options, old.n + 1, (n, why) => this.leaseLost(n, why));
        this.#recoveries++;
        this.#last = { reason, at: this.#last.at, ms: Date.now() - t0 };
        log.info({ reason, ms: Date.now() - t0 }, "recovered: a new runtime took this daemon's work again");
        return;
      } catch (e) {
        log.warn({ err: e, delayMs: delay }, "booting a new runtime failed; trying again");
        this.watch.suspect();
        await pause(delay);
      }
    }
  }
}

/** A runtime on a new pool, its boot recovery run and its takeover sweep started. */
async function bootGeneration(
  options: RuntimeCycleOptions,
  n: number,
  onLeaseLost: (n: number, reason: string) => void,
): Promise<RuntimeGeneration> {
  const { config, db, log } = options;
  const pool = daemonPool(db.url, 16, log);
  let rt: DaemonRuntime | undefined;
  try {
    rt = await assembleRuntime(config, pool, log, options.observeTurn, (owner, e) =>
      onLeaseLost(
        n,
        `the connection holding owner lease ${owner} failed: ${e instanceof Error ? e.message : String(e)}`,
      ),
    );
    // Boot recovery of delegations and workflows before anything is accepted: every interrupted call and
    // workflow is claimed and on its way. From then on a peer that dies has its work taken over here.
    await rt.recover();
    await rt.startTakeover();
    const rpc = new RpcRegistry();
    options.methods(rpc, rt);
    return { n, rt, rpc };
  } catch (e) {
    if (rt) await rt.close({ abandonCheckpoint: true }).catch(() => undefined);
    else await pool.end().catch(() => undefined);
    throw e;
  }
}
