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
export async function listenOnChannel(
  pool: pg.Pool,
  channel: string,
  handlers: ChannelHandlers,
): Promise<ChannelListener> {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(channel)) throw new Error(`not a channel name: ${channel}`);
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
        if (n.channel === channel && n.payload) handlers.onPayload(n.payload);
      });
      mine.once("error", (e) => {
        handlers.onError(e);
        if (drop(mine)) again(100);
      });
      await mine.query(`listen ${channel}`);
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
      await c.query(`unlisten ${channel}`).catch(() => undefined);
      c.release();
    },
  };
}
