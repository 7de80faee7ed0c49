import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream, mkdirSync, readFileSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { join } from "node:path";
import { AppServerClient } from "./appServerClient.js";
import { type CodexHomeOptions, codexNativeBin, writeCodexHome } from "./codexHome.js";

/**
 * The real `codex app-server` of the pinned package, offline: its own CODEX_HOME (see codexHome.ts),
 * listening on ws://127.0.0.1:PORT so that several clients (the test, the crw run process) share one
 * server, its stderr in `<home>/app-server.log`.
 */

export interface RealCodexOptions extends Omit<CodexHomeOptions, "dir"> {
  home: string;
  /** The server's working directory (threads default to it). */
  cwd: string;
  env?: NodeJS.ProcessEnv;
  startTimeoutMs?: number;
  /**
   * `ws`: ws://127.0.0.1:PORT. `unix`: the control socket under CODEX_HOME, which
   * `codex app-server proxy` (crw's default host command) bridges to.
   */
  listen?: "ws" | "unix";
  /** The ws port (default: a free one); a restart keeps it, so clients reconnect to the same URL. */
  port?: number;
}

export interface RealCodex {
  /** ws://127.0.0.1:PORT, or unix://<control socket>. */
  url: string;
  /** The options it was started with (for a restart on the same CODEX_HOME). */
  options: RealCodexOptions;
  home: string;
  process: ChildProcess;
  /** The test's own client, already initialized. */
  client: AppServerClient;
  log(): string;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Where `codex app-server --listen unix://` puts its control socket (a link to the real one). */
export function controlSocketPath(home: string): string {
  return join(home, "app-server-control", "app-server-control.sock");
}

async function accepts(where: number | string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
    if (typeof where === "number") socket.connect(where, "127.0.0.1");
    else socket.connect(where);
  });
}

export async function startRealCodex(options: RealCodexOptions): Promise<RealCodex> {
  mkdirSync(options.home, { recursive: true });
  writeCodexHome({ ...options, dir: options.home });
  const listen = options.listen ?? "ws";
  const port = listen === "ws" ? (options.port ?? (await freePort())) : 0;
  const socketPath = controlSocketPath(options.home);
  const url = listen === "ws" ? `ws://127.0.0.1:${port}` : `unix://${socketPath}`;
  const logPath = join(options.home, "app-server.log");
  const log = createWriteStream(logPath);
  const child = spawn(codexNativeBin(), ["app-server", "--listen", listen === "ws" ? url : "unix://"], {
    cwd: options.cwd,
    env: {
      ...process.env,
      ...options.env,
      CODEX_HOME: options.home,
      RUST_LOG: process.env.RUST_LOG ?? "warn",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stdout?.pipe(log);
  child.stderr?.pipe(log);
  let exited: string | null = null;
  child.on("exit", (code, signal) => {
    exited = `app-server exited (${signal ?? code})`;
  });
  const deadline = Date.now() + (options.startTimeoutMs ?? 20_000);
  while (!(await accepts(listen === "ws" ? port : socketPath))) {
    if (exited) throw new Error(`${exited}: ${readFileSync(logPath, "utf8").slice(-2000)}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`app-server did not listen on ${url} in time`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const client = await AppServerClient.connect(listen === "ws" ? url : `ws+unix://${socketPath}:/`);
  return {
    url,
    options: { ...options, ...(listen === "ws" ? { port } : {}) },
    home: options.home,
    process: child,
    client,
    log: () => readFileSync(logPath, "utf8"),
    async stop() {
      client.close();
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise<void>((resolve) => child.once("exit", () => resolve()));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 3_000);
        await gone;
        clearTimeout(timer);
      }
      log.end();
    },
  };
}

/** A stopped server started again on the same CODEX_HOME (config.toml is written again from the options). */
export async function restartRealCodex(
  codex: RealCodex,
  changes: Partial<RealCodexOptions> = {},
): Promise<RealCodex> {
  await codex.stop();
  return startRealCodex({ ...codex.options, ...changes });
}

/**
 * Trusts every hook the server lists for `cwd` (hooks run only once trusted): `hooks/list`, then a
 * `[hooks.state."<key>"] trusted_hash = "<currentHash>"` table per untrusted hook appended to the extra TOML,
 * then a restart so the server reads it. Answers the restarted server and the keys it trusted.
 */
export async function trustHooks(
  codex: RealCodex,
  cwd: string,
): Promise<{ codex: RealCodex; trusted: string[] }> {
  const listed = await codex.client.request<{
    data: Array<{
      hooks: Array<{ key: string; currentHash: string; trustStatus: string }>;
      errors: unknown[];
    }>;
  }>("hooks/list", { cwds: [cwd] });
  const untrusted = listed.data.flatMap((entry) => entry.hooks).filter((h) => h.trustStatus !== "trusted");
  const state = untrusted
    .map((h) => `\n[hooks.state.${JSON.stringify(h.key)}]\ntrusted_hash = ${JSON.stringify(h.currentHash)}\n`)
    .join("");
  const restarted = await restartRealCodex(codex, { extraToml: `${codex.options.extraToml ?? ""}${state}` });
  return { codex: restarted, trusted: untrusted.map((h) => h.key) };
}
