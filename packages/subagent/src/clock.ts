/**
 * Time as the pool's startup episode sees it. Only retry timing goes through it, so tests can drive the
 * episode's backoff deterministically while every process in the test stays real.
 */
export interface Clock {
  now(): number;
  /** Resolve after `ms`, or reject with the signal's reason once it aborts. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      signal?.addEventListener("abort", onAbort, { once: true });
    }),
};

/** A clock that moves only when told to; sleeps resolve as `advance` passes their deadline. */
export class ManualClock implements Clock {
  #now = 0;
  readonly #sleepers: { until: number; resolve: () => void }[] = [];
  /** Every sleep requested, in order, for asserting the backoff schedule. */
  readonly requested: number[] = [];

  now(): number {
    return this.#now;
  }

  get pendingSleeps(): number {
    return this.#sleepers.length;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    this.requested.push(ms);
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const sleeper = { until: this.#now + ms, resolve };
      this.#sleepers.push(sleeper);
      signal?.addEventListener(
        "abort",
        () => {
          const at = this.#sleepers.indexOf(sleeper);
          if (at >= 0) this.#sleepers.splice(at, 1);
          reject(signal.reason);
        },
        { once: true },
      );
    });
  }

  advance(ms: number): void {
    this.#now += ms;
    for (const s of [...this.#sleepers]) {
      if (s.until <= this.#now) {
        this.#sleepers.splice(this.#sleepers.indexOf(s), 1);
        s.resolve();
      }
    }
  }
}
