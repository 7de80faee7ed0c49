import type { WorkflowJournalNodeRow, WorkflowJournalNodeText, WorkflowJournalWrite } from "@crw/db";
import { WorkflowStateError } from "../errors.js";
import type { OrchestrationJournal } from "../journal/schema.js";

/**
 * The orchestration journal as it is stored: a header (the journal without its nodes) in
 * `workflow_journals.body`, and one row per node in `workflow_journal_nodes` holding its state, its entry
 * of each per-node map and its place in `order`. A write names only the nodes that changed; reading folds
 * the rows back onto the header into the one journal document the engine works on.
 */

/** The journal's maps keyed by node id, and the field of a node's row that holds its entry of each. */
export const NODE_MAPS = [
  ["nodeAccess", "access"],
  ["nodeModels", "model"],
  ["nodeWorktrees", "worktree"],
] as const;

/** What a node's row holds: its entry of `nodes` and of each per-node map (absent ones left out). */
export interface NodeRowBody {
  readonly state?: unknown;
  readonly access?: unknown;
  readonly model?: unknown;
  readonly worktree?: unknown;
}

/** A node's row as read (@crw/db's row), its body in this layout. */
export interface NodeRow extends WorkflowJournalNodeRow {
  readonly body: NodeRowBody;
}

/** A node's row to write, its body serialized already. */
export type NodeRowText = WorkflowJournalNodeText;

/** One journal write, serialized: the whole header and the rows of the nodes that changed. */
export type JournalWrite = WorkflowJournalWrite;

type Doc = Record<string, unknown>;

const entryOf = (map: unknown, id: string): unknown =>
  typeof map === "object" && map !== null && Object.hasOwn(map, id)
    ? (map as Record<string, unknown>)[id]
    : undefined;

/** Every node id of the journal with its index in `order` (null for a node missing from it). */
export function nodePositions(journal: OrchestrationJournal): Map<string, number | null> {
  const positions = new Map<string, number | null>();
  journal.order.forEach((id, i) => {
    if (positions.has(id))
      throw new WorkflowStateError("invalid_journal", `node ${id} is listed twice in the journal's order`, {
        workflowId: journal.workflowId,
        nodeId: id,
      });
    positions.set(id, i);
  });
  for (const id of Object.keys(journal.nodes)) if (!positions.has(id)) positions.set(id, null);
  return positions;
}

/** A node's row body: its state and its entries of the per-node maps. */
export function nodeRowBody(journal: OrchestrationJournal, id: string): NodeRowBody {
  const body: Record<string, unknown> = {};
  const state = entryOf(journal.nodes, id);
  if (state !== undefined) body.state = state;
  for (const [map, field] of NODE_MAPS) {
    const entry = entryOf(journal[map], id);
    if (entry !== undefined) body[field] = entry;
  }
  return body;
}

/**
 * The journal without its nodes. A per-node map stays in it as present or absent (assembly brings it
 * back only when present), with any entry that names no node.
 */
export function journalHeader(journal: OrchestrationJournal, positions: ReadonlyMap<string, unknown>): Doc {
  const { nodes: _nodes, order: _order, ...header } = journal;
  const out: Doc = header;
  for (const [map] of NODE_MAPS) {
    const entries = journal[map];
    if (entries === undefined) continue;
    out[map] = Object.fromEntries(Object.entries(entries).filter(([id]) => !positions.has(id)));
  }
  return out;
}

/** The whole journal as one write: the header and every node's row (a run's first write). */
export function wholeJournalWrite(journal: OrchestrationJournal): JournalWrite {
  const positions = nodePositions(journal);
  return {
    header: JSON.stringify(journalHeader(journal, positions)),
    nodes: [...positions].map(([id, position]) => ({
      id,
      position,
      body: JSON.stringify(nodeRowBody(journal, id)),
    })),
  };
}

/**
 * The journal document a header and its node rows stand for: `order` from the rows' positions, `nodes`
 * and each per-node map the header has from the rows' entries. A header that is not an object is
 * returned as it is (it is refused on reading, as any malformed journal).
 */
export function assembleJournal(header: unknown, rows: readonly NodeRow[]): unknown {
  if (typeof header !== "object" || header === null || Array.isArray(header)) return header;
  const doc: Doc = { ...(header as Doc) };
  doc.order = rows
    .filter((r) => r.position !== null)
    .sort((a, b) => (a.position as number) - (b.position as number))
    .map((r) => r.id);
  // fromEntries defines own properties: a node id such as `__proto__` stays an ordinary key.
  doc.nodes = Object.fromEntries(
    rows.filter((r) => r.body.state !== undefined).map((r) => [r.id, r.body.state]),
  );
  for (const [map, field] of NODE_MAPS) {
    if (!Object.hasOwn(doc, map)) continue;
    const base = doc[map];
    const own = rows.filter((r) => r.body[field] !== undefined).map((r) => [r.id, r.body[field]] as const);
    doc[map] =
      typeof base === "object" && base !== null && !Array.isArray(base)
        ? Object.fromEntries([...Object.entries(base), ...own])
        : base;
  }
  return doc;
}
