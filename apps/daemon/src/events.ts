/**
 * Live events inside one daemon, by topic (`session:<id>`, `workflow:<id>`). Only live views (taps, followers
 * of a workflow) listen; nothing here is the truth of anything: a view that misses an event reads the rows.
 * A listener that throws is dropped from nothing and affects no other listener.
 */
export class EventBus {
  readonly #topics = new Map<string, Set<(event: unknown) => void>>();

  publish(topic: string, event: unknown): void {
    for (const listener of this.#topics.get(topic) ?? []) {
      try {
        listener(event);
      } catch {
        // A view's failure is its own; the producer goes on.
      }
    }
  }

  /** Subscribes; the returned function unsubscribes (idempotent). */
  subscribe(topic: string, listener: (event: unknown) => void): () => void {
    let set = this.#topics.get(topic);
    if (!set) {
      set = new Set();
      this.#topics.set(topic, set);
    }
    set.add(listener);
    return () => {
      const s = this.#topics.get(topic);
      if (!s) return;
      s.delete(listener);
      if (s.size === 0) this.#topics.delete(topic);
    };
  }

  get listenerCount(): number {
    let n = 0;
    for (const s of this.#topics.values()) n += s.size;
    return n;
  }
}
