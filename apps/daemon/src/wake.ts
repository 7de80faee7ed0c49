import {
  addWakeFilter,
  announceWatches,
  type ChannelListener,
  listenForWakes,
  type PgDelegationRepository,
} from "@crw/db";
import type pg from "pg";

/**
 * How long a live view waits for a wake before it re-reads anyway. A lost notification (a listener
 * reconnecting, a writer that sends none) costs a view at most this; it is never what makes a view correct.
 */
export const DEFAULT_WAKE_FALLBACK_MS = 3_000;

/** How often a process announces its live views again while they last; an announcement lives 3 times this. */
export const WATCH_ANNOUNCE_MS = 10_000;
/**
 * After the listener (re)connects, writes notify whatever they touch for this long: announcements sent
 * while it was away are being sent again (it asked with "?") and are not all in yet.
 */
const RELEARN_MS = 1_000;

export const journalWakeKey = (sessionId: string) => `journal:${sessionId.toLowerCase()}`;
export const workflowWakeKey = (workflowId: string) => `workflow:${workflowId.toLowerCase()}`;
export const inboxWakeKey = (sessionId: string) => `inbox:${sessionId.toLowerCase()}`;

const wakeKeyOf = { journal: journalWakeKey, workflow: workflowWakeKey, inbox: inboxWakeKey } as const;

/** Why `Watch.next` returned. */
export type WakeReason = "woken" | "fallback" | "aborted";

/**
 * One live view's subscription to a key. Opened before the view's first read, so a wake that comes between
 * a read and the next wait is kept (`pending`) rather than lost. A wake carrying a seq at or below what the
 * view has `seen` is no news and is ignored (the same commit heard in-process and again through NOTIFY
 * costs one read, not two).
 */
export interface Watch {
  /** The view has read up to `seq`. */
  seen(seq: number): void;
  /**
   * Resolves at the first news since the previous call, after `boundMs` (the hub's fallback bound when
   * absent), or on abort.
   */
  next(signal?: AbortSignal, boundMs?: number): Promise<WakeReason>;
  close(): void;
}

interface WatchState {
  seen: number;
  /** The newest seq heard since the last `next` (Infinity: a wake without one); -Infinity: none. */
  pending: number;
  resolve: (() => void) | undefined;
}

/**
 * Fan-out of wakes to live views in this process (`session.tap`, `workflow.follow`, a client's `session.take`
 * waiting for a result). Writes made here wake
 * their keys directly (`wake`); writes of other processes (another daemon sharing the database) arrive
 * through the process's one LISTEN connection, opened by `attach`. Nothing here is the truth: a wake only
 * makes a view re-read its rows now rather than at its fallback bound.
 *
 * Who watches what is announced on `crw_watch` (when a key's first view here opens, every
 * WATCH_ANNOUNCE_MS while it lasts, and on request after a reconnect), so each process's writes notify only
 * keys some process has a view of. A write racing an announcement (the view opened a moment ago in another
 * daemon) may go unnotified: that view then reads it at its fallback bound, as after any lost notification.
 */
export class WakeHub {
  /** The bound of every wait (tests set it long to prove a wake arrives without it). */
  fallbackMs = DEFAULT_WAKE_FALLBACK_MS;
  readonly counts = { wakes: 0, notifications: 0, listens: 0 };
  readonly #watches = new Map<string, Set<WatchState>>();
  /** Keys any process (this one included) announced a live view of, with when that announcement lapses. */
  readonly #announced = new Map<string, number>();
  #pool: pg.Pool | undefined;
  #onError: (e: unknown) => void = () => {};
  #listener: Promise<ChannelListener> | undefined;
  /** Since when this process hears announcements (null: it does not, so every write must notify). */
  #hearingSince: number | null = null;
  #announcer: NodeJS.Timeout | undefined;
  #removeFilter: (() => void) | undefined;
  #closed = false;

  /**
   * Opens the process's one wake listener on `pool` and makes this process's journal and workflow writes
   * notify only what some process watches (see `wakeWanted` in @crw/db). Kept until `close`.
   */
  attach(pool: pg.Pool, onError: (e: unknown) => void): void {
    if (this.#pool || this.#closed) return;
    this.#pool = pool;
    this.#onError = onError;
    this.#removeFilter = addWakeFilter((kind, id) => this.isWatched(wakeKeyOf[kind](id)));
    this.#listener = this.listen(pool);
    this.#listener.catch(onError);
    this.#announcer = setInterval(() => {
      this.#announce([...this.#watches.keys()]);
      const now = Date.now();
      for (const [k, until] of this.#announced) if (until <= now) this.#announced.delete(k);
    }, WATCH_ANNOUNCE_MS);
    this.#announcer.unref();
  }

  /**
   * Whether a write of `key` should notify: some process has a live view of it, or this process cannot
   * tell (not hearing announcements, or only just again).
   */
  isWatched(key: string): boolean {
    if (this.#hearingSince === null || Date.now() - this.#hearingSince < RELEARN_MS) return true;
    if (this.#watches.has(key)) return true;
    const until = this.#announced.get(key);
    if (until === undefined) return false;
    if (until > Date.now()) return true;
    this.#announced.delete(key);
    return false;
  }

  /**
   * No other process is live on the database (the boot's own check): none has a view this process could
   * have missed while it was not listening, so the relearning window after its listener came up ends now,
   * and writes notify only what is announced from here on. Without it, every write of the boot's first
   * second notifies, and each such commit waits its turn for the server's notification queue.
   */
  async aloneOnDatabase(): Promise<void> {
    await this.#listener?.catch(() => undefined);
    if (this.#hearingSince !== null)
      this.#hearingSince = Math.min(this.#hearingSince, Date.now() - RELEARN_MS);
  }

  /** Ends the listener (before the pool ends: it holds one of its connections). Views keep their bound. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#hearingSince = null;
    clearInterval(this.#announcer);
    this.#removeFilter?.();
    const listener = this.#listener;
    this.#listener = undefined;
    await (await listener?.catch(() => undefined))?.close();
  }

  #announce(keys: readonly string[] | "?"): void {
    const pool = this.#pool;
    if (!pool || this.#closed || (keys !== "?" && keys.length === 0)) return;
    announceWatches(pool, keys).catch(this.#onError);
  }

  /** News for `key`; `seq` is the last journal row the write made, when known. */
  wake(key: string, seq: number | null = null): void {
    this.counts.wakes += 1;
    const news = seq ?? Number.POSITIVE_INFINITY;
    for (const w of this.#watches.get(key) ?? []) {
      if (news <= w.seen) continue;
      if (w.resolve) w.resolve();
      else w.pending = Math.max(w.pending, news);
    }
  }

  /** Every view re-reads: the listener was (re)opened and may have missed notifications meanwhile. */
  wakeAll(): void {
    for (const key of this.#watches.keys()) this.wake(key);
  }

  watch(key: string): Watch {
    const state: WatchState = {
      seen: Number.NEGATIVE_INFINITY,
      pending: Number.NEGATIVE_INFINITY,
      resolve: undefined,
    };
    let set = this.#watches.get(key);
    if (!set) {
      set = new Set();
      this.#watches.set(key, set);
    }
    set.add(state);
    // The first view of a key here: tell every writer (this process's own writes consult #watches).
    if (set.size === 1) this.#announce([key]);
    return {
      seen: (seq) => {
        state.seen = Math.max(state.seen, seq);
      },
      next: (signal, boundMs) => {
        if (state.pending > state.seen) {
          state.pending = Number.NEGATIVE_INFINITY;
          return Promise.resolve("woken");
        }
        state.pending = Number.NEGATIVE_INFINITY;
        if (signal?.aborted) return Promise.resolve("aborted");
        return new Promise<WakeReason>((resolve) => {
          const done = (reason: WakeReason) => {
            clearTimeout(timer);
            signal?.removeEventListener("abort", onAbort);
            state.resolve = undefined;
            resolve(reason);
          };
          const onAbort = () => done("aborted");
          const timer = setTimeout(() => done("fallback"), boundMs ?? this.fallbackMs);
          signal?.addEventListener("abort", onAbort, { once: true });
          state.resolve = () => done("woken");
        });
      },
      close: () => {
        state.resolve?.();
        const s = this.#watches.get(key);
        if (!s) return;
        s.delete(state);
        if (s.size === 0) this.#watches.delete(key);
      },
    };
  }

  get watchCount(): number {
    let n = 0;
    for (const s of this.#watches.values()) n += s.size;
    return n;
  }

  private listen(pool: pg.Pool): Promise<ChannelListener> {
    return listenForWakes(pool, {
      onJournal: (sessionId, seq) => {
        this.counts.notifications += 1;
        this.wake(journalWakeKey(sessionId), seq);
      },
      onWorkflow: (workflowId) => {
        this.counts.notifications += 1;
        this.wake(workflowWakeKey(workflowId));
      },
      onInbox: (sessionId) => {
        this.counts.notifications += 1;
        this.wake(inboxWakeKey(sessionId));
      },
      onWatch: (keys) => {
        if (keys === "?") return this.#announce([...this.#watches.keys()]);
        const until = Date.now() + 3 * WATCH_ANNOUNCE_MS;
        for (const k of keys) this.#announced.set(k, until);
      },
      onListening: () => {
        this.counts.listens += 1;
        this.#hearingSince = Date.now();
        // What was announced or written while it was away: ask every process (this one too: its own "?"
        // comes back to it) to announce again, and re-read every view.
        this.#announce("?");
        this.wakeAll();
      },
      onError: (e) => {
        // Until it listens again it cannot hear announcements: every write notifies meanwhile.
        this.#hearingSince = null;
        this.#onError(e);
      },
    });
  }
}

/**
 * The repository with its journal writes waking this process's views of that journal as soon as they
 * commit, without waiting for the NOTIFY to come back through the listener (which still wakes the views
 * of other daemons). Only calls whose first argument is the written session.
 */
export function wakeOnJournalWrites(repo: PgDelegationRepository, hub: WakeHub): PgDelegationRepository {
  const writes = new Set(["append", "settleProvisional", "deliverResults", "deliverSteers"]);
  return new Proxy(repo, {
    get(target, key, receiver) {
      const value = Reflect.get(target, key, receiver) as unknown;
      if (typeof value !== "function" || typeof key !== "string" || !writes.has(key)) return value;
      return async (...args: unknown[]) => {
        const result = await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        const sessionId = args[0];
        if (typeof sessionId === "string") {
          const seqs = Array.isArray(result)
            ? result.map((e) => (e as { seq?: unknown }).seq).filter((s) => typeof s === "number")
            : [];
          hub.wake(journalWakeKey(sessionId), key === "append" && seqs.length > 0 ? Math.max(...seqs) : null);
        }
        return result;
      };
    },
  });
}
