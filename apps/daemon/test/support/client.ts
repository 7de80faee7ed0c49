import WebSocket from "ws";

export interface Notification {
  method: string;
  params: Record<string, unknown>;
}

/** A small JSON-RPC client over the daemon's WebSocket, collecting notifications. */
export class TestClient {
  readonly notifications: Notification[] = [];
  #next = 1;
  readonly #pending = new Map<number, (frame: Record<string, unknown>) => void>();
  readonly #timers = new Set<NodeJS.Timeout>();

  private constructor(readonly ws: WebSocket) {
    ws.on("message", (data) => {
      const frame = JSON.parse(data.toString()) as Record<string, unknown>;
      if (typeof frame.id === "number" && this.#pending.has(frame.id)) {
        const resolve = this.#pending.get(frame.id);
        this.#pending.delete(frame.id);
        resolve?.(frame);
      } else if (typeof frame.method === "string") {
        this.notifications.push({ method: frame.method, params: frame.params as Record<string, unknown> });
      }
    });
    // A closed connection answers every pending call with an error frame at once.
    ws.on("close", () => {
      for (const resolve of this.#pending.values())
        resolve({ error: { code: -1, message: "connection closed", data: { code: "connection_closed" } } });
      this.#pending.clear();
      for (const t of this.#timers) clearTimeout(t);
      this.#timers.clear();
    });
  }

  static connect(url: string, token?: string): Promise<TestClient> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(
        `${url.replace("http", "ws")}/rpc`,
        token ? { headers: { authorization: `Bearer ${token}` } } : {},
      );
      ws.once("open", () => resolve(new TestClient(ws)));
      ws.once("unexpected-response", (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
      ws.once("error", reject);
    });
  }

  /** The whole reply frame: `{ result }` or `{ error: { code, message, data: { name, code } } }`. */
  call(method: string, params: object = {}): Promise<Record<string, unknown>> {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${method} got no answer in 60 s`)), 60_000);
      this.#timers.add(timer);
      this.#pending.set(id, (frame) => {
        clearTimeout(timer);
        this.#timers.delete(timer);
        resolve(frame);
      });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  /** The result, or throws with the error's data code. */
  async ok<T = Record<string, unknown>>(method: string, params: object = {}): Promise<T> {
    const frame = await this.call(method, params);
    if (frame.error) {
      const e = frame.error as { message: string; data?: { code?: string } };
      throw Object.assign(new Error(e.message), { code: e.data?.code });
    }
    return frame.result as T;
  }

  close(): void {
    this.ws.close();
  }
}

/** A `{"steps": [...]}` task for the offline scripted provider. */
export const steps = (...list: object[]) => JSON.stringify({ steps: list });
