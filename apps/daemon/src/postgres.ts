import { join } from "node:path";
import { runningPostmaster, startEmbeddedCluster, stopPostmaster } from "@crw/db";

/** The daemon's database: an external server, or an embedded cluster that lives in the data directory. */
export interface DaemonDatabase {
  readonly url: string;
  readonly kind: "external" | "embedded" | "adopted";
  /** Stops an embedded cluster this daemon started or adopted; an external server is left alone. */
  stop(): Promise<void>;
}

const USER = "crw";
const PASSWORD = "crw";
const DATABASE = "crw";

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
 * `DATABASE_URL` when configured; else the embedded cluster under `<dataDir>/postgres`: made on first use,
 * adopted when a previous daemon was killed and left its server running (that keeps every committed row and
 * avoids a second server on one data directory, which PostgreSQL would refuse anyway), started otherwise.
 */
export async function openDaemonDatabase(
  config: { dataDir: string; databaseUrl: string | undefined },
  log: (msg: string, fields?: object) => void = () => {},
): Promise<DaemonDatabase> {
  if (config.databaseUrl) return { url: config.databaseUrl, kind: "external", stop: async () => {} };
  const dataDir = join(config.dataDir, "postgres");
  const adopted = await runningPostmaster(dataDir);
  if (adopted) {
    log("adopting running embedded postgres", adopted);
    await ensureDatabase(adopted.port);
    return { url: embeddedUrl(adopted.port), kind: "adopted", stop: () => stopPostmaster(adopted.pid) };
  }
  const cluster = await startEmbeddedCluster({ dataDir, persistent: true, user: USER, password: PASSWORD });
  await ensureDatabase(cluster.port);
  log("embedded postgres started", { dataDir, port: cluster.port });
  return { url: cluster.url(DATABASE), kind: "embedded", stop: () => cluster.stop() };
}
