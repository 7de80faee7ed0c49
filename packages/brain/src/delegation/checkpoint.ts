import { DelegationError, toError } from "./errors.js";

/**
 * The restart checkpoint of a process that hosts delegations (the daemon awaits it before closing its
 * runner pool). `pauseForRestart()` stops admitting new delegations and new turn work, drains every
 * journal write and every progress/result publication already captured (a write queued behind one in
 * flight commits too), and does not wait for model or tool turns: boot recovery continues those from
 * the rows. Idempotent (every call returns the same checkpoint); rejects with `RestartCheckpointError`
 * when a drained write or publication failed.
 */
export interface RestartCheckpoint {
  pauseForRestart(): Promise<void>;
}

/** A captured write or publication failed while the checkpoint drained it; the process must not exit 0. */
export class RestartCheckpointError extends Error {
  override readonly name = "RestartCheckpointError";
  readonly code = "checkpoint_failed";
  constructor(readonly failures: readonly Error[]) {
    super(
      `the restart checkpoint could not drain ${failures.length} write(s): ${failures
        .map((f) => f.message)
        .join("; ")}`,
      { cause: failures[0] },
    );
  }
}

/** The error every admission (and every write not yet captured) gets once the checkpoint began. */
export function pausedError(what: string): DelegationError {
  return new DelegationError(
    "paused_for_restart",
    `${what} refused: this process is pausing for a restart; boot recovery continues its work`,
  );
}

/**
 * The journal writes and publications this process has captured and not yet settled. Writes of one
 * session run in the order they were captured (a runner may report a tool result while the previous
 * write is still in flight: it commits after it, never before). Once closed, new writes are refused;
 * `drain()` settles the ones captured before and reports the failures among them.
 */
export class CapturedWrites {
  readonly #inFlight = new Set<Promise<unknown>>();
  readonly #tails = new Map<string, Promise<unknown>>();
  #closed = false;
  #failures: Error[] | undefined;

  get closed(): boolean {
    return this.#closed;
  }

  /** Runs `write` now (or, with a key, after the key's captured writes), unless the checkpoint began. */
  capture<T>(what: string, write: () => Promise<T>, key?: string): Promise<T> {
    if (this.#closed) return Promise.reject(pausedError(what));
    let run: Promise<T>;
    if (key === undefined) {
      run = write();
    } else {
      const prev = this.#tails.get(key) ?? Promise.resolve();
      run = prev.then(write, write);
      const tail = run.catch(() => {});
      this.#tails.set(key, tail);
      void tail.then(() => {
        if (this.#tails.get(key) === tail) this.#tails.delete(key);
      });
    }
    this.#inFlight.add(run);
    void run.then(
      () => this.#inFlight.delete(run),
      (e: unknown) => {
        this.#inFlight.delete(run);
        this.#failures?.push(toError(e));
      },
    );
    return run;
  }

  /** Refuses new writes, then settles every captured one; rejects with the failures among them. */
  async drain(): Promise<void> {
    this.#closed = true;
    this.#failures ??= [];
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
    // Let the settled writes' own bookkeeping run before the failures are read.
    await Promise.resolve();
    if (this.#failures.length > 0) throw new RestartCheckpointError(this.#failures);
  }
}
