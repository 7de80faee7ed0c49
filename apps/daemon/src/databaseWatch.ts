import { isDatabaseUnavailable, pingDatabase } from "@crw/db";
import type pg from "pg";
import type { Logger } from "pino";
import type { DaemonDatabase } from "./postgres.js";

/** The database as /health shows it while the daemon runs. */
export interface DatabaseHealth {
  readonly ok: boolean;
  /** Since when it has answered (ok) or not (lost). */
  readonly since: string;
  /** Why it does not answer, while it does not. */
  readonly error: string | null;
  /** How many times it was lost since the daemon started, and how many times crw started it again. */
  readonly losses: number;
  readonly restarts: number;
}

export interface DatabaseWatchOptions {
  /** The pool probes run on (one of its own: the runtime's pool is ended and made anew on a loss). */
  readonly pool: pg.Pool;
  readonly db: DaemonDatabase;
  readonly log: Logger;
  /** Between two probes while the database answers. */
  readonly intervalMs?: number;
  /** A probe not answered in this time counts as failed. */
  readonly probeTimeoutMs?: number;
  /** Probes that timed out in a row before the database counts as lost (a refused connection counts at once). */
  readonly lostAfterTimeouts?: number;
  /** The longest wait between two probes while the database is lost (it doubles from 250 ms up to this). */
  readonly retryMaxMs?: number;
  /** The database has just been found lost. */
  readonly onLost: (cause: Error) => void;
}

const MAX_RETRY_MS = 5_000;

/**
 * Notices that the database stopped answering and brings an embedded one back: while it is lost, a
 * server crw runs is started again on its data directory (an external one is only probed), with a
 * growing, bounded backoff. A slow answer is not a loss until several probes in a row time out, so a
 * loaded machine does not make the daemon drop its work.
 */
export class DatabaseWatch {
  #ok = true;
  #since = new Date();
  #error: string | null = null;
  #losses = 0;
  #restarts = 0;
  #timeouts = 0;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  #probing: Promise<void> | undefined;
  #retryMs = 250;
  #waiters: (() => void)[] = [];

  constructor(private readonly options: DatabaseWatchOptions) {}

  get available(): boolean {
    return this.#ok;
  }

  health(): DatabaseHealth {
    return {
      ok: this.#ok,
      since: this.#since.toISOString(),
      error: this.#error,
      losses: this.#losses,
      restarts: this.#restarts,
    };
  }

  /** Resolves when the database answers (at once while it does), or when the watch stops. */
  answering(): Promise<void> {
    if (this.#ok || this.#stopped) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  start(): void {
    this.#schedule(this.options.intervalMs ?? 1_000);
  }

  /** Something failed on the database: probe now rather than at the next interval. */
  suspect(): void {
    if (this.#stopped || this.#probing) return;
    clearTimeout(this.#timer);
    this.#probing = this.#probe().finally(() => {
      this.#probing = undefined;
    });
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#wake();
    await this.#probing;
  }

  #schedule(ms: number): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => this.suspect(), ms);
    this.#timer.unref();
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  async #probe(): Promise<void> {
    const failed = await pingDatabase(this.options.pool, this.options.probeTimeoutMs ?? 2_000);
    if (this.#stopped) return;
    if (!failed) {
      this.#answered();
      this.#schedule(this.options.intervalMs ?? 1_000);
      return;
    }
    this.#error = failed.message;
    if (this.#ok) {
      this.#timeouts = isDatabaseUnavailable(failed) ? Number.POSITIVE_INFINITY : this.#timeouts + 1;
      if (this.#timeouts < (this.options.lostAfterTimeouts ?? 3)) {
        this.#schedule(250);
        return;
      }
      this.#lost(failed);
    }
    await this.#revive();
    this.#schedule(this.#retryMs);
    this.#retryMs = Math.min(this.#retryMs * 2, this.options.retryMaxMs ?? MAX_RETRY_MS);
  }

  #lost(cause: Error): void {
    this.#ok = false;
    this.#since = new Date();
    this.#losses++;
    this.#retryMs = 250;
    this.options.log.error({ err: cause, database: this.options.db.kind }, "the database stopped answering");
    this.options.onLost(cause);
  }

  #answered(): void {
    this.#timeouts = 0;
    if (this.#ok) return;
    this.options.log.info({ lostMs: Date.now() - this.#since.getTime() }, "the database answers again");
    this.#ok = true;
    this.#since = new Date();
    this.#error = null;
    this.#wake();
  }

  async #revive(): Promise<void> {
    try {
      if (await this.options.db.revive()) this.#restarts++;
    } catch (e) {
      // a server whose old processes still hold its shared memory refuses to start: the next probe retries
      this.#error = `${this.#error}; starting it again failed: ${e instanceof Error ? e.message : String(e)}`;
      this.options.log.warn({ err: e }, "starting the embedded database again failed; retrying");
    }
  }
}
