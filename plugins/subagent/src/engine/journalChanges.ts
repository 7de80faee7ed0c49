import type { OrchestrationJournal } from "../journal/schema.js";
import {
  type JournalWrite,
  journalHeader,
  NODE_MAPS,
  type NodeRowText,
  nodePositions,
  nodeRowBody,
} from "../store/journalLayout.js";

/** What the rows held after the run's last committed write. */
interface Committed {
  /** Each node's index in `order` (null: not in it). */
  readonly positions: ReadonlyMap<string, number | null>;
  /** How much of `order` it covered. */
  readonly ordered: number;
  /** The per-node maps' entries that name no node, as the first write found them (kept in the header). */
  readonly residue: Readonly<Record<string, Record<string, unknown>>>;
  readonly header: string;
}

/**
 * The journal writes of one run. Its first write is the whole journal, whatever the rows held before (a
 * journal read at boot, an explicit resume's, the document of an older layout); each later one is the
 * header and the rows of the nodes changed since the last committed write (`changed`, and every node
 * appended to `order`), so its size and the work to make it do not grow with the workflow.
 */
export class JournalChanges {
  #committed: Committed | undefined;
  /** Nodes changed since the last committed write, each with the stamp of its latest change. */
  readonly #changed = new Map<string, number>();
  #stamp = 0;

  /** A node's state or map entries changed: its row is part of the next write. */
  changed(id: string): void {
    this.#changed.set(id, ++this.#stamp);
  }

  /** The write that brings the rows to `journal`, and what to record once it committed. */
  next(journal: OrchestrationJournal): { write: JournalWrite; committed: () => void } {
    const before = this.#committed;
    const ordered = journal.order.length;
    let positions = before?.positions ?? nodePositions(journal);
    const rows = before ? [...this.#changed.keys()] : [...positions.keys()];
    if (before && ordered > before.ordered) {
      // `order` only grows within a run: the nodes appended since are new rows.
      const grown = new Map(positions);
      for (let i = before.ordered; i < ordered; i++) {
        const id = journal.order[i] as string;
        grown.set(id, i);
        rows.push(id);
      }
      positions = grown;
    }
    const residue = before?.residue ?? residueOf(journal, positions);
    const header = JSON.stringify(headerOf(journal, residue));
    const nodes: NodeRowText[] = [...new Set(rows)].map((id) => ({
      id,
      position: positions.get(id) ?? null,
      body: JSON.stringify(nodeRowBody(journal, id)),
    }));
    const taken = new Map(this.#changed);
    return {
      write: { header, nodes },
      committed: () => {
        this.#committed = { positions, ordered, residue, header };
        // A node changed again while the write was in flight stays changed.
        for (const [id, stamp] of taken) if (this.#changed.get(id) === stamp) this.#changed.delete(id);
      },
    };
  }

  /** Whether `journal` holds anything its last committed write did not. */
  pending(journal: OrchestrationJournal): boolean {
    const before = this.#committed;
    if (!before || this.#changed.size > 0 || journal.order.length > before.ordered) return true;
    return JSON.stringify(headerOf(journal, before.residue)) !== before.header;
  }
}

function residueOf(
  journal: OrchestrationJournal,
  positions: ReadonlyMap<string, unknown>,
): Record<string, Record<string, unknown>> {
  const header = journalHeader(journal, positions);
  const residue: Record<string, Record<string, unknown>> = {};
  for (const [map] of NODE_MAPS) {
    const entries = header[map];
    if (entries !== undefined) residue[map] = entries as Record<string, unknown>;
  }
  return residue;
}

/** The header of `journal` without walking its nodes: each per-node map present holds only its residue. */
function headerOf(
  journal: OrchestrationJournal,
  residue: Readonly<Record<string, Record<string, unknown>>>,
): Record<string, unknown> {
  const { nodes: _nodes, order: _order, ...header } = journal;
  const out: Record<string, unknown> = header;
  for (const [map] of NODE_MAPS) if (journal[map] !== undefined) out[map] = residue[map] ?? {};
  return out;
}
