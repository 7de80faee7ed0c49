import { spawn } from "node:child_process";
import { ClientError, type ConnectOptions, DaemonClient } from "../client/connection.js";

/** How long the MCP server waits for a daemon (one it started, or one restarting) before a call fails. */
const DAEMON_WAIT_MS = 60_000;

export interface LinkOptions extends ConnectOptions {
  /** The client session's name (one MCP connection is one crw root session). */
  readonly sessionName: string;
  /** Where the client works: the session's working directory when the session is made. */
  readonly cwd: string;
  readonly model?: string | undefined;
  /** Start the local daemon (`crw daemon start`) when none answers on the data directory. */
  readonly startDaemon: boolean;
  readonly log: (line: string) => void;
}

export interface ClientSession {
  readonly sessionId: string;
  readonly cwd: string | null;
  readonly model: string;
}

/**
 * The MCP server's connection to its daemon. It keeps no state of its own that matters: the session is
 * found again by name on every new connection, so a daemon that restarted (or another daemon of the same
 * database) serves the same session. A call over a connection that ended connects again first.
 */
export class DaemonLink {
  #client: DaemonClient | undefined;
  #connecting: Promise<DaemonClient> | undefined;
  #session: ClientSession | undefined;
  #closed = false;

  constructor(readonly options: LinkOptions) {}

  /** The session this link serves, opened (or found again) on the first connection. */
  async session(): Promise<ClientSession> {
    await this.client();
    return this.#session as ClientSession;
  }

  /** Calls a daemon method; `onNotify` sees the notifications that arrive while it runs. */
  async call<T = Record<string, unknown>>(
    method: string,
    params: object,
    onNotify?: (method: string, params: Record<string, unknown>) => void,
  ): Promise<T> {
    const client = await this.client();
    const off = onNotify ? client.onNotification(onNotify) : undefined;
    try {
      return await client.call<T>(method, params);
    } finally {
      off?.();
    }
  }

  /** A call that changes nothing: a connection that ended under it is replaced and the call asked again. */
  async read<T = Record<string, unknown>>(method: string, params: object): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.call<T>(method, params);
      } catch (e) {
        if (!(e instanceof ClientError) || e.code !== "connection_closed" || attempt >= 3) throw e;
      }
    }
  }

  async client(): Promise<DaemonClient> {
    if (this.#client && !this.#client.closed) return this.#client;
    this.#connecting ??= this.#connect().finally(() => {
      this.#connecting = undefined;
    });
    return this.#connecting;
  }

  /** Ends the connection and any wait for a daemon (so a server whose client left exits promptly). */
  close(): void {
    this.#closed = true;
    this.#client?.close();
  }

  async #connect(): Promise<DaemonClient> {
    const client = await this.#reach();
    if (this.#closed) {
      client.close();
      throw new ClientError("the MCP server is closing", "closing");
    }
    try {
      const opened = await client.call<{
        sessionId: string;
        cwd: string | null;
        model: string;
        created: boolean;
      }>("session.open", {
        name: this.options.sessionName,
        cwd: this.options.cwd,
        ...(this.options.model && { model: this.options.model }),
      });
      if (this.#session && this.#session.sessionId !== opened.sessionId)
        this.options.log(`session ${this.options.sessionName} is now ${opened.sessionId}`);
      else if (!this.#session)
        this.options.log(
          `${opened.created ? "made" : "found"} session ${this.options.sessionName} (${opened.sessionId})`,
        );
      this.#session = { sessionId: opened.sessionId, cwd: opened.cwd, model: opened.model };
    } catch (e) {
      client.close();
      throw e;
    }
    this.#client = client;
    return client;
  }

  /** A connection to a daemon; with a data directory and no daemon answering, one is started and awaited. */
  async #reach(): Promise<DaemonClient> {
    const until = Date.now() + DAEMON_WAIT_MS;
    let started = false;
    for (let delay = 100; ; delay = Math.min(delay * 2, 1_000)) {
      try {
        return await DaemonClient.connect(this.options);
      } catch (e) {
        const code = e instanceof ClientError ? e.code : "";
        // A daemon that does not answer, or died, may be restarting: wait for it. None ever recorded on the
        // data directory is worth waiting for only when this server starts one.
        const starts = this.options.startDaemon && !this.options.url;
        const absent =
          code === "unreachable" || (code === "not_running" && (starts || (await this.#recorded())));
        if (!absent || Date.now() > until || this.#closed) throw e;
        if (!started && this.options.startDaemon && !this.options.url) {
          started = true;
          await this.#startDaemon();
          continue;
        }
      }
      await new Promise((r) => setTimeout(r, delay));
    }
  }

  /** Whether a daemon was ever recorded on the data directory (alive or not). */
  async #recorded(): Promise<boolean> {
    const { defaultDataDir, readState } = await import("@crw/daemon/control");
    return (await readState(this.options.dataDir ?? defaultDataDir(), { includeDead: true })) !== undefined;
  }

  /** `crw daemon start` on the link's data directory; its output goes to stderr (stdout is the protocol). */
  async #startDaemon(): Promise<void> {
    const cli = process.argv[1];
    if (!cli) return;
    this.options.log("no daemon answers; starting one ('crw daemon start')");
    const args = [
      cli,
      "daemon",
      "start",
      ...(this.options.dataDir ? ["--data-dir", this.options.dataDir] : []),
    ];
    const code = await new Promise<number>((resolve) => {
      const child = spawn(process.execPath, args, { stdio: ["ignore", 2, 2] });
      child.once("error", () => resolve(1));
      child.once("exit", (c) => resolve(c ?? 1));
    });
    // Another process may have started it meanwhile: the next connection attempt tells.
    if (code !== 0) this.options.log(`'crw daemon start' exited ${code}`);
  }
}
