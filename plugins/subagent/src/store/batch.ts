interface Waiter<V> {
  readonly resolve: (value: V | undefined) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * Reads by key, batched per tick: every key asked for while no statement has been issued yet joins the
 * next one, which is issued on the following microtask. Each caller's read therefore starts after it
 * asked (as strong as a read of its own), while callers of the same tick (the nodes of a workflow launched
 * together, the workflows a recovery pass resumes) share one statement.
 */
export class TickBatchedReader<K, V> {
  #queued: Map<K, Waiter<V>[]> | undefined;

  constructor(private readonly load: (keys: K[]) => Promise<Map<K, V>>) {}

  read(key: K): Promise<V | undefined> {
    return new Promise((resolve, reject) => {
      let queued = this.#queued;
      if (!queued) {
        const fresh = new Map<K, Waiter<V>[]>();
        queued = fresh;
        this.#queued = fresh;
        queueMicrotask(() => void this.#issue(fresh));
      }
      const waiters = queued.get(key) ?? [];
      waiters.push({ resolve, reject });
      queued.set(key, waiters);
    });
  }

  async #issue(queued: Map<K, Waiter<V>[]>): Promise<void> {
    if (this.#queued === queued) this.#queued = undefined;
    let found: Map<K, V>;
    try {
      found = await this.load([...queued.keys()]);
    } catch (e) {
      for (const waiters of queued.values()) for (const w of waiters) w.reject(e);
      return;
    }
    for (const [key, waiters] of queued) for (const w of waiters) w.resolve(found.get(key));
  }
}
