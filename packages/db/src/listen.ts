import type pg from "pg";

export interface ChannelListener {
  /** Ends the listening connection. */
  close(): Promise<void>;
}

export interface ChannelHandlers {
  /** Each notification's payload. */
  readonly onPayload: (payload: string) => void;
  /**
   * Runs each time the listener is (again) in place, so a caller can check for what a lost connection
   * may have missed.
   */
  readonly onListening: () => void;
  readonly onError: (e: unknown) => void;
}

/**
 * LISTEN on one channel on a connection of its own. A lost connection is opened again with a growing,
 * bounded backoff; `onListening` tells the caller each time it is back.
 */
export function listenOnChannel(
  pool: pg.Pool,
  channel: string,
  handlers: ChannelHandlers,
): Promise<ChannelListener> {
  return listenOnChannels(pool, [channel], {
    onNotification: (_channel, payload) => handlers.onPayload(payload),
    onListening: handlers.onListening,
    onError: handlers.onError,
  });
}

export interface ChannelsHandlers {
  /** Each notification with a payload, with the channel it came on. */
  readonly onNotification: (channel: string, payload: string) => void;
  readonly onListening: () => void;
  readonly onError: (e: unknown) => void;
}

function checkChannel(channel: string): void {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(channel)) throw new Error(`not a channel name: ${channel}`);
}

/**
 * LISTEN on one channel on a connection of its own, held until `close` and not opened again when lost:
 * for a listener whose notifications only hurry what it would also find out later. Opening it throws
 * when the connection or its LISTEN fails.
 */
export async function listenWhileConnected(
  pool: pg.Pool,
  channel: string,
  onPayload: (payload: string) => void,
): Promise<ChannelListener> {
  checkChannel(channel);
  const client = await pool.connect();
  // Given back once: broken when the connection failed, so that no later borrower gets it as a listener.
  let released = false;
  const release = (broken?: Error) => {
    if (released) return;
    released = true;
    client.release(broken ?? false);
  };
  client.on("notification", (n) => {
    if (n.payload) onPayload(n.payload);
  });
  // A borrowed connection has no error listener of the pool's: one the server ends (a restart, a cut
  // connection) would be an uncaught error. The listener is then gone for good, by design.
  client.on("error", (e) => release(e));
  try {
    await client.query(`listen ${channel}`);
  } catch (e) {
    release(e instanceof Error ? e : new Error(String(e)));
    throw e;
  }
  return {
    close: async () => {
      if (released) return;
      await client.query("unlisten *").catch(() => undefined);
      release();
    },
  };
}

/** listenOnChannel for several channels on one connection (one LISTEN per channel, one reconnect loop). */
export async function listenOnChannels(
  pool: pg.Pool,
  channels: readonly string[],
  handlers: ChannelsHandlers,
): Promise<ChannelListener> {
  for (const channel of channels) checkChannel(channel);
  const wanted = new Set(channels);
  let closed = false;
  let client: pg.PoolClient | undefined;
  let retry: NodeJS.Timeout | undefined;
  const again = (delay: number) => {
    if (!closed) retry = setTimeout(() => void open(Math.min(delay * 2, 5_000)), delay);
  };
  const drop = (c: pg.PoolClient) => {
    if (client !== c) return false;
    client = undefined;
    c.release(true);
    return true;
  };
  const open = async (delay: number): Promise<void> => {
    let c: pg.PoolClient | undefined;
    try {
      c = await pool.connect();
      const mine = c;
      client = mine;
      mine.on("notification", (n) => {
        if (wanted.has(n.channel) && n.payload) handlers.onNotification(n.channel, n.payload);
      });
      mine.once("error", (e) => {
        handlers.onError(e);
        if (drop(mine)) again(100);
      });
      await mine.query(channels.map((channel) => `listen ${channel}`).join("; "));
      handlers.onListening();
    } catch (e) {
      handlers.onError(e);
      if (!c || drop(c)) again(delay);
    }
  };
  await open(100);
  return {
    close: async () => {
      closed = true;
      clearTimeout(retry);
      const c = client;
      client = undefined;
      if (!c) return;
      await c.query(channels.map((channel) => `unlisten ${channel}`).join("; ")).catch(() => undefined);
      c.release();
    },
  };
}

/**
 * Wake channels: a notification sent in the transaction of a write (delivered at its commit, dropped with
 * its rollback) so live views in any process re-read the rows at once instead of on a timer. A payload is
 * only a hint of what to re-read; the rows stay the truth, and a lost notification costs the reader its
 * fallback bound, never correctness.
 *
 * - `crw_journal`: `<session id>:<last seq written>` from a journal append (`<session id>` alone when rows
 *   changed without a new seq: provisional rows settled). PostgreSQL folds identical payloads of one
 *   transaction into one notification.
 * - `crw_workflow`: `<workflow id>` from an orchestration journal write, snapshot publication, summary
 *   handoff or terminal status.
 * - `crw_inbox`: `<session id>` from a result entering that session's inbox (a settled call, a workflow's
 *   summary), for a client waiting to take its results.
 * - `crw_watch`: which keys (`journal:<id>`, `workflow:<id>`, `inbox:<id>`) some process has a live view of, announced by
 *   that process when the view opens and again while it lasts; `?` asks every process to announce again.
 *
 * Why writers ask `wakeWanted` first: every transaction that notifies takes PostgreSQL's cluster-wide
 * notify lock and holds it through its commit's WAL flush, so notifying commits are serialized (no group
 * commit). Writes of journals nobody watches (nearly all of them, on a busy daemon) must not pay that.
 */
export const JOURNAL_WAKE_CHANNEL = "crw_journal";
export const WORKFLOW_WAKE_CHANNEL = "crw_workflow";
export const INBOX_WAKE_CHANNEL = "crw_inbox";
export const WATCH_CHANNEL = "crw_watch";

export type WakeKind = "journal" | "workflow" | "inbox";
export type WakeFilter = (kind: WakeKind, id: string) => boolean;
const wakeFilters = new Set<WakeFilter>();

/**
 * Registers this process's knowledge of who watches (see WakeHub in the daemon); the returned function
 * removes it. With no filter registered, every write notifies: a process that does not hear the watch
 * announcements cannot know that nobody watches.
 */
export function addWakeFilter(filter: WakeFilter): () => void {
  wakeFilters.add(filter);
  return () => {
    wakeFilters.delete(filter);
  };
}

/** Whether a write of `id` should send its wake notification. */
export function wakeWanted(kind: WakeKind, id: string): boolean {
  if (wakeFilters.size === 0) return true;
  for (const f of wakeFilters) if (f(kind, id)) return true;
  return false;
}

/** Announces live views of `keys` (or, with "?", asks every process to announce its own), in few notifications. */
export async function announceWatches(pool: pg.Pool, keys: readonly string[] | "?"): Promise<void> {
  const payloads: string[] = [];
  if (keys === "?") payloads.push("?");
  else {
    // A payload is at most 8000 bytes; keys are ASCII.
    let current = "";
    for (const k of keys) {
      if (current && current.length + k.length + 1 > 7000) {
        payloads.push(current);
        current = "";
      }
      current = current ? `${current} ${k}` : k;
    }
    if (current) payloads.push(current);
  }
  if (payloads.length === 0) return;
  await pool.query("select pg_notify($1, p) from unnest($2::text[]) as p", [WATCH_CHANNEL, payloads]);
}

export interface WakeHandlers {
  /** A journal changed; `seq` is the last row written when the writer said so. */
  readonly onJournal: (sessionId: string, seq: number | null) => void;
  readonly onWorkflow: (workflowId: string) => void;
  /** A result entered this session's inbox. */
  readonly onInbox: (sessionId: string) => void;
  /** Some process announced live views of these keys, or (`"?"`) asks for announcements. */
  readonly onWatch: (keys: readonly string[] | "?") => void;
  /** The listener is (again) in place: whatever it missed meanwhile must be re-read. */
  readonly onListening: () => void;
  readonly onError: (e: unknown) => void;
}

/** One connection listening on the wake channels and the watch announcements. */
export function listenForWakes(pool: pg.Pool, handlers: WakeHandlers): Promise<ChannelListener> {
  const channels = [JOURNAL_WAKE_CHANNEL, WORKFLOW_WAKE_CHANNEL, INBOX_WAKE_CHANNEL, WATCH_CHANNEL];
  return listenOnChannels(pool, channels, {
    onNotification: (channel, payload) => {
      if (channel === WORKFLOW_WAKE_CHANNEL) return handlers.onWorkflow(payload);
      if (channel === INBOX_WAKE_CHANNEL) return handlers.onInbox(payload);
      if (channel === WATCH_CHANNEL)
        return handlers.onWatch(payload === "?" ? "?" : payload.split(" ").filter(Boolean));
      const [sessionId = "", seq] = payload.split(":");
      const n = seq === undefined ? Number.NaN : Number(seq);
      handlers.onJournal(sessionId, Number.isSafeInteger(n) ? n : null);
    },
    onListening: handlers.onListening,
    onError: handlers.onError,
  });
}
