/**
 * A fair admission queue: one FIFO lane per producer, producers served in rotation.
 *
 * Invariant (private): `rotation` holds exactly the keys of the non-empty lanes, each once, in service
 * order. `shift` serves the head producer's oldest item and moves that producer to the back of the
 * rotation if it still has items. A missing or empty head lane means the invariant broke somewhere; the
 * queue throws instead of silently dropping state.
 */
export class FairQueue<T, K = string> {
  readonly #lanes = new Map<K, T[]>();
  readonly #rotation: K[] = [];
  #size = 0;

  get size(): number {
    return this.#size;
  }

  push(producer: K, item: T): void {
    let lane = this.#lanes.get(producer);
    if (!lane) {
      lane = [];
      this.#lanes.set(producer, lane);
      this.#rotation.push(producer);
    }
    lane.push(item);
    this.#size += 1;
  }

  /** The next item in producer rotation, or undefined only when the queue is empty. */
  shift(): T | undefined {
    if (this.#rotation.length === 0) {
      if (this.#size !== 0) throw new FairQueueInvariantError(`no lanes but size ${this.#size}`);
      return undefined;
    }
    const producer = this.#rotation.shift() as K;
    const lane = this.#lanes.get(producer);
    if (!lane || lane.length === 0) {
      throw new FairQueueInvariantError(`head lane ${String(producer)} is ${lane ? "empty" : "missing"}`);
    }
    const item = lane.shift() as T;
    this.#size -= 1;
    if (lane.length > 0) this.#rotation.push(producer);
    else this.#lanes.delete(producer);
    return item;
  }

  /** Remove and return every queued item of one producer (e.g. when its channel is aborted). */
  removeProducer(producer: K): T[] {
    const lane = this.#lanes.get(producer);
    if (!lane) return [];
    this.#lanes.delete(producer);
    const at = this.#rotation.indexOf(producer);
    if (at >= 0) this.#rotation.splice(at, 1);
    this.#size -= lane.length;
    return lane;
  }

  /** Remove items matching a predicate, keeping lane order and rotation of the rest. */
  removeWhere(match: (item: T) => boolean): T[] {
    const removed: T[] = [];
    for (const [producer, lane] of [...this.#lanes]) {
      const keep = lane.filter((item) => !match(item));
      if (keep.length === lane.length) continue;
      removed.push(...lane.filter(match));
      this.#size -= lane.length - keep.length;
      if (keep.length > 0) {
        this.#lanes.set(producer, keep);
      } else {
        this.#lanes.delete(producer);
        this.#rotation.splice(this.#rotation.indexOf(producer), 1);
      }
    }
    return removed;
  }

  *items(): IterableIterator<T> {
    for (const lane of this.#lanes.values()) yield* lane;
  }

  /**
   * Test seam for the invariant check: corrupt the private state the way a bug would. Kept on the class so
   * the throwing path is proven against the real implementation.
   */
  static corruptForTest<T, K>(
    queue: FairQueue<T, K>,
    how: "empty-head" | "missing-head" | "lost-rotation",
  ): void {
    const head = queue.#rotation[0];
    if (head === undefined) throw new Error("corruptForTest needs a non-empty queue");
    if (how === "missing-head") queue.#lanes.delete(head);
    else if (how === "lost-rotation") queue.#rotation.length = 0;
    else queue.#lanes.set(head, []);
  }
}

export class FairQueueInvariantError extends Error {
  override readonly name = "FairQueueInvariantError";
  readonly code = "fair_queue_invariant";
  readonly retryable = false;
}
