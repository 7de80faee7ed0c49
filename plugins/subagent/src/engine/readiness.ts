import { type NodeState, type OrchestrationJournal, TERMINAL_NODE_STATUSES } from "../journal/schema.js";

/**
 * The nodes a run's pump looks at, so that one node event costs work in its dependents, not in the whole
 * workflow: a node that ends makes its dependents candidates (ready or blocked now), a node appended to
 * `order` is one itself, and when nothing runs every node is looked at again (a change no event announced
 * still starts what it made ready).
 */
export class NodeReadiness {
  /** How much of `order` is indexed (it only grows within a run). */
  #indexed = 0;
  readonly #position = new Map<string, number>();
  readonly #dependents = new Map<string, string[]>();
  readonly #candidates = new Set<string>();
  /** Every node before this index of `order` was terminal when last looked at. */
  #firstOpen = 0;

  /** A node ended: its dependents may be ready or blocked now. */
  ended(id: string): void {
    for (const d of this.#dependents.get(id) ?? []) this.#candidates.add(d);
  }

  /** Candidates not launched yet (the node cap held them back): looked at again next time. */
  requeue(ids: readonly string[]): void {
    for (const id of ids) this.#candidates.add(id);
  }

  /** The candidates since the last call (every node when `all`), in journal order. */
  take(journal: OrchestrationJournal, all: boolean): string[] {
    this.#index(journal);
    const ids = all ? journal.order : [...this.#candidates];
    this.#candidates.clear();
    return [...ids].sort((a, b) => (this.#position.get(a) ?? 0) - (this.#position.get(b) ?? 0));
  }

  /** Whether some node is not terminal: scanned from the first one that was open, all of them to say no. */
  open(journal: OrchestrationJournal): boolean {
    const terminal = (id: string) => TERMINAL_NODE_STATUSES.has((journal.nodes[id] as NodeState).status);
    const order = journal.order;
    while (this.#firstOpen < order.length && terminal(order[this.#firstOpen] as string)) this.#firstOpen++;
    if (this.#firstOpen < order.length) return true;
    const open = order.findIndex((id) => !terminal(id));
    if (open < 0) return false;
    this.#firstOpen = open;
    return true;
  }

  #index(journal: OrchestrationJournal): void {
    for (; this.#indexed < journal.order.length; this.#indexed++) {
      const id = journal.order[this.#indexed] as string;
      this.#position.set(id, this.#indexed);
      for (const dep of (journal.nodes[id] as NodeState).spec.dependsOn) {
        const list = this.#dependents.get(dep);
        if (list) list.push(id);
        else this.#dependents.set(dep, [id]);
      }
      this.#candidates.add(id);
    }
  }
}
