import { randomBytes } from "node:crypto";
import { readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { ensureDatabase, runningPostmaster, socketUrl, startEmbeddedCluster, stopPostmaster } from "@crw/db";

/** The daemon's database: an external server, or an embedded cluster that lives in the data directory. */
export interface DaemonDatabase {
  readonly url: string;
  readonly kind: "external" | "embedded" | "adopted";
  /** Stops an embedded cluster this daemon started or adopted; an external server is left alone. */
  stop(): Promise<void>;
  /**
   * After the database stopped answering: an embedded cluster whose server is gone is started again on the
   * same data directory and port (answers true); an external server, or an embedded one still running, is
   * left to come back by itself (false).
   */
  revive(): Promise<boolean>;
}

const USER = "crw";
/** Clusters made before the password file existed were made with this one. */
const LEGACY_PASSWORD = "crw";
const DATABASE = "crw";

const embeddedUrl = (port: number, password: string, db = DATABASE) =>
  `postgres://${USER}:${encodeURIComponent(password)}@127.0.0.1:${port}/${db}`;

/** The daemon's own connections go through the server's Unix socket when it has one: a cheaper round trip. */
const daemonUrl = (port: number, password: string, socketDir: string | null) =>
  socketDir ? socketUrl(USER, password, socketDir, port, DATABASE) : embeddedUrl(port, password);

/**
 * The superuser password of the embedded cluster, kept beside it readable by the invoking user only. A new
 * cluster gets a random one, written (fsync'd) before initdb so that a crash between the two never leaves a
 * cluster whose password is lost.
 */
async function clusterPassword(dataDir: string): Promise<{ password: string; fresh: boolean }> {
  const file = join(dataDir, "postgres.password");
  const kept = await readFile(file, "utf8").catch(() => undefined);
  if (kept !== undefined) return { password: kept.trim(), fresh: false };
  const made = await stat(join(dataDir, "postgres", "PG_VERSION")).then(
    () => true,
    () => false,
  );
  if (made) return { password: LEGACY_PASSWORD, fresh: false };
  const password = randomBytes(24).toString("base64url");
  await writeFile(file, `${password}\n`, { mode: 0o600, flush: true });
  return { password, fresh: true };
}

/** The daemon's database on the embedded server, made through its `postgres` database when missing. */
const ensureDaemonDatabase = (port: number, password: string) =>
  ensureDatabase(embeddedUrl(port, password, "postgres"), DATABASE);

/**
 * `DATABASE_URL` when configured; else the embedded cluster under `<dataDir>/postgres`: made on first use,
 * adopted when a previous daemon was killed and left its server running (that keeps every committed row and
 * avoids a second server on one data directory, which PostgreSQL would refuse anyway), started otherwise.
 */
export async function openDaemonDatabase(
  config: { dataDir: string; databaseUrl: string | undefined },
  log: (msg: string, fields?: object) => void = () => {},
): Promise<DaemonDatabase> {
  if (config.databaseUrl)
    return { url: config.databaseUrl, kind: "external", stop: async () => {}, revive: async () => false };
  const dataDir = join(config.dataDir, "postgres");
  const { password, fresh } = await clusterPassword(config.dataDir);
  const adopted = await runningPostmaster(dataDir);
  let stop: () => Promise<void>;
  let port: number;
  let socketDir: string | null;
  if (adopted) {
    log("adopting running embedded postgres", adopted);
    await ensureDaemonDatabase(adopted.port, password);
    port = adopted.port;
    socketDir = adopted.socketDir;
    stop = () => stopPostmaster(adopted.pid, dataDir);
  } else {
    const cluster = await startEmbeddedCluster({ dataDir, persistent: true, user: USER, password, fresh });
    if (cluster.setAside)
      log("a cluster left by a removed data directory at this path was moved aside", {
        to: cluster.setAside,
      });
    // A server this start began is stopped again when the database cannot be made: nothing is left running.
    await ensureDaemonDatabase(cluster.port, password).catch(async (e: unknown) => {
      await cluster.stop().catch(() => undefined);
      throw e;
    });
    log("embedded postgres started", { dataDir, port: cluster.port, runsAs: cluster.runsAs });
    port = cluster.port;
    socketDir = cluster.socketDir;
    stop = () => cluster.stop();
  }
  return {
    url: daemonUrl(port, password, socketDir),
    kind: adopted ? "adopted" : "embedded",
    stop: () => stop(),
    // the same port and data directory (so the same socket): the pool's connection string stays right
    revive: async () => {
      if (await runningPostmaster(dataDir)) return false;
      const cluster = await startEmbeddedCluster({ dataDir, persistent: true, user: USER, password, port });
      log("embedded postgres started again", { dataDir, port });
      stop = () => cluster.stop();
      return true;
    },
  };
}
