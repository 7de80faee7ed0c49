/**
 * In-process wake-ups keyed by session. Only a hint: every waiter re-reads the database after waking, and
 * every wait is bounded, so a wake-up lost (or sent by another process) costs at most one bound.
 */
export class Notifier {
  readonly #waiters = new Map<string, Set<() => void>>();
  readonly #listeners = new Set<(key: string) => void>();

  /**
   * Hears every wake-up (a host that carries them on to waiters of its own, such as a client's take
   * waiting on other processes' settlements too). Returns the function that stops it.
   */
  listen(listener: (key: string) => void): () => void {
    this.#listeners.add(listener);
    return () => {
      this.#listeners.delete(listener);
    };
  }

  notify(key: string): void {
    for (const listener of this.#listeners) listener(key);
    const set = this.#waiters.get(key);
    if (!set) return;
    this.#waiters.delete(key);
    for (const wake of set) wake();
  }

  wait(key: string, boundMs: number): Promise<void> {
    return new Promise((resolve) => {
      const set = this.#waiters.get(key) ?? new Set();
      this.#waiters.set(key, set);
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        resolve();
      };
      const timer = setTimeout(done, boundMs);
      set.add(done);
    });
  }
}

/** One holder at a time per key, FIFO; the truth of what ran stays in the journal. */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<void>>();

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => {
      release = r;
    });
    const tail = prev.then(() => mine);
    this.#tails.set(key, tail);
    await prev;
    try {
      return await fn();
    } finally {
      release();
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    }
  }

  busy(key: string): boolean {
    return this.#tails.has(key);
  }
}
