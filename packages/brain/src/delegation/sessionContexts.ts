import type { DelegationRepository, JournalDelta, JournalEntry, TranscriptMessage } from "@crw/db";
import { contextOfFold, extendFold, type FoldedContext, foldJournal } from "./context.js";

/** How much folded context one process keeps: the most recently used sessions within both bounds. */
export interface SessionContextBounds {
  readonly sessions: number;
  /** Approximate: the JSON length of the messages held. */
  readonly bytes: number;
}

export const SESSION_CONTEXT_BOUNDS: SessionContextBounds = { sessions: 512, bytes: 64 * 1024 * 1024 };

interface Held {
  readonly folded: FoldedContext;
  /** When the row at `folded.throughSeq` was written (null for an empty fold): it must still be there. */
  readonly anchor: number | null;
  /** The journal's reclaimed-row count when folded: a reclaimed prefix is no longer in the journal. */
  readonly reclaimedRows: number;
  readonly bytes: number;
}

const sizes = new WeakMap<object, number>();

function sizeOf(message: TranscriptMessage): number {
  let size = sizes.get(message);
  if (size === undefined) {
    size = JSON.stringify(message).length;
    sizes.set(message, size);
  }
  return size;
}

/** Held messages are shared by every turn that reads them: nobody may change one. */
function frozen<T>(value: T): T {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) frozen(v);
  }
  return value;
}

/**
 * A session's rows split where the fold must stop: the rows before the first provisional one are final
 * (a settled row stays as it is), the settled rows after it belong to this read only, since the provisional
 * row may still settle into place below them.
 */
function splitAtProvisional(entries: readonly JournalEntry[]): {
  final: JournalEntry[];
  later: JournalEntry[];
} {
  const open = entries.findIndex((e) => !e.settled);
  if (open === -1) return { final: [...entries], later: [] };
  return { final: entries.slice(0, open), later: entries.slice(open).filter((e) => e.settled) };
}

/**
 * The model context of sessions, kept folded per process and brought up to date by reading only the rows
 * after the newest one folded, so a turn's read does not grow with its journal. Rows another process
 * appended are among those rows. Before it extends a fold, the read checks that the journal below still
 * holds what was folded (the row at the fold's seq, the reclaimed-row count); when it cannot tell, the
 * journal is read whole and folded anew. Each call hands out a new array; the messages the fold holds are
 * frozen, since every later turn shares them.
 */
export class SessionContexts {
  readonly #held = new Map<string, Held>();
  #bytes = 0;

  constructor(
    private readonly repo: DelegationRepository,
    private readonly bounds: SessionContextBounds = SESSION_CONTEXT_BOUNDS,
  ) {}

  /** Sessions and approximate bytes held now. */
  get size(): { sessions: number; bytes: number } {
    return { sessions: this.#held.size, bytes: this.#bytes };
  }

  async contextOf(sessionId: string, principalAccountId: string): Promise<TranscriptMessage[]> {
    const held = this.#held.get(sessionId);
    if (held) {
      const delta = await this.repo.readJournalAfter(sessionId, principalAccountId, held.folded.throughSeq);
      const context = this.#extend(sessionId, held, delta);
      if (context) return context;
    }
    const whole = await this.repo.readJournalAfter(sessionId, principalAccountId, 0);
    return this.#refold(sessionId, whole);
  }

  /** The context of a journal the caller holds whole (read or written just now): folded and kept, not read. */
  adopt(sessionId: string, whole: JournalDelta): TranscriptMessage[] {
    return this.#refold(sessionId, whole);
  }

  #extend(sessionId: string, held: Held, delta: JournalDelta): TranscriptMessage[] | undefined {
    if (delta.anchorCreatedAt?.getTime() !== (held.anchor ?? undefined)) return undefined;
    if (delta.reclaimedRows !== held.reclaimedRows) return undefined;
    const { final, later } = splitAtProvisional(delta.entries);
    const folded = extendFold(held.folded, frozen(final));
    if (!folded) return undefined;
    const now = later.length > 0 ? extendFold(folded, later) : folded;
    if (!now) return undefined;
    this.#keep(sessionId, folded, final.at(-1)?.createdAt.getTime() ?? held.anchor, delta.reclaimedRows);
    return contextOfFold(now);
  }

  #refold(sessionId: string, whole: JournalDelta): TranscriptMessage[] {
    const { final, later } = splitAtProvisional(whole.entries);
    const folded = foldJournal(frozen(final));
    this.#keep(sessionId, folded, final.at(-1)?.createdAt.getTime() ?? null, whole.reclaimedRows);
    return contextOfFold(later.length > 0 ? foldJournal([...final, ...later]) : folded);
  }

  #keep(sessionId: string, folded: FoldedContext, anchor: number | null, reclaimedRows: number): void {
    this.#drop(sessionId);
    const bytes = folded.messages.reduce((n, m) => n + sizeOf(m), 0);
    if (bytes > this.bounds.bytes) return;
    this.#held.set(sessionId, { folded, anchor, reclaimedRows, bytes });
    this.#bytes += bytes;
    for (const [oldest] of this.#held) {
      if (this.#held.size <= this.bounds.sessions && this.#bytes <= this.bounds.bytes) break;
      this.#drop(oldest);
    }
  }

  #drop(sessionId: string): void {
    const held = this.#held.get(sessionId);
    if (!held) return;
    this.#held.delete(sessionId);
    this.#bytes -= held.bytes;
  }
}
