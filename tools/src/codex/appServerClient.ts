import WebSocket from "ws";

/**
 * A test's own client of a (real or fake) app-server over ws: requests with a bound, every
 * notification kept in order, waits for a notification by predicate. A `configWarning` fails every
 * later request and wait: a test host that read a config it did not understand would use the real
 * provider.
 */
export class AppServerClient {
  readonly notifications: Array<{ method: string; params: Record<string, unknown> }> = [];
  private nextId = 1;
  private readonly pending = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  private readonly waiters = new Set<() => void>();
  private fatal: Error | null = null;

  private constructor(private readonly socket: WebSocket) {
    socket.on("message", (data) => {
      for (const line of data.toString().split("\n")) if (line.trim()) this.receive(line);
    });
    socket.on("close", () => this.fail(new Error("app-server connection closed")));
  }

  static async connect(url: string, timeoutMs = 10_000): Promise<AppServerClient> {
    const socket = new WebSocket(url, { handshakeTimeout: timeoutMs, perMessageDeflate: false });
    await new Promise<void>((resolve, reject) => {
      socket.once("open", () => resolve());
      socket.once("error", reject);
    });
    const client = new AppServerClient(socket);
    await client.request("initialize", {
      clientInfo: { name: "crw-test", title: "crw test", version: "0.1.0" },
      capabilities: { experimentalApi: true, requestAttestation: false },
    });
    socket.send(JSON.stringify({ method: "initialized" }));
    return client;
  }

  request<T = Record<string, unknown>>(method: string, params: unknown, timeoutMs = 15_000): Promise<T> {
    if (this.fatal) return Promise.reject(this.fatal);
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method}: no answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.socket.send(JSON.stringify({ id, method, params }));
    });
  }

  /** Resolves with the first notification (already received or later) that matches. */
  waitFor(
    match: (n: { method: string; params: Record<string, unknown> }) => boolean,
    timeoutMs = 60_000,
    from = 0,
  ): Promise<{ method: string; params: Record<string, unknown> }> {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.fatal) return done(this.fatal);
        const found = this.notifications.slice(from).find(match);
        if (found) done(null, found);
      };
      const timer = setTimeout(
        () => done(new Error(`no matching notification within ${timeoutMs} ms`)),
        timeoutMs,
      );
      const done = (error: Error | null, value?: { method: string; params: Record<string, unknown> }) => {
        clearTimeout(timer);
        this.waiters.delete(check);
        if (error) reject(error);
        else resolve(value as { method: string; params: Record<string, unknown> });
      };
      this.waiters.add(check);
      check();
    });
  }

  /** Waits for `turn/completed` of the turn. */
  async waitTurnCompleted(
    threadId: string,
    turnId: string,
    timeoutMs = 90_000,
  ): Promise<Record<string, unknown>> {
    const n = await this.waitFor(
      (x) =>
        x.method === "turn/completed" &&
        x.params.threadId === threadId &&
        (x.params.turn as { id?: string } | undefined)?.id === turnId,
      timeoutMs,
    );
    return n.params.turn as Record<string, unknown>;
  }

  close(): void {
    this.socket.terminate();
  }

  private fail(error: Error): void {
    if (!this.fatal) this.fatal = error;
    for (const [id, p] of this.pending) {
      this.pending.delete(id);
      p.reject(error);
    }
    for (const waiter of [...this.waiters]) waiter();
  }

  private receive(line: string): void {
    const message = JSON.parse(line) as {
      id?: number;
      method?: string;
      params?: Record<string, unknown>;
      result?: unknown;
      error?: { message: string };
    };
    if (message.id !== undefined && message.method === undefined) {
      const p = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.error) p?.reject(new Error(message.error.message));
      else p?.resolve(message.result);
      return;
    }
    if (message.id !== undefined && message.method !== undefined) {
      this.socket.send(JSON.stringify({ id: message.id, error: { code: -32601, message: "not served" } }));
      return;
    }
    if (message.method) {
      this.notifications.push({ method: message.method, params: message.params ?? {} });
      if (message.method === "configWarning") {
        this.fail(new Error(`configWarning from app-server: ${JSON.stringify(message.params)}`));
      }
      for (const waiter of [...this.waiters]) waiter();
    }
  }
}
