// Starts an embedded cluster in argv[2] with the built @crw/db, as whoever runs this script, and prints
// one JSON line: who the server runs as (from the server process itself) and who the SQL session is; or
// the typed error. argv[3] "throwaway" removes the cluster on stop.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import pg from "pg";
import { startEmbeddedCluster } from "../../dist/index.js";

const [dataDir, mode] = process.argv.slice(2);
try {
  const cluster = await startEmbeddedCluster({ dataDir, persistent: mode !== "throwaway" });
  const pid = Number(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
  const uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
  const client = new pg.Client(cluster.url());
  await client.connect();
  const { rows } = await client.query("select current_user as user");
  await client.end();
  process.stdout.write(
    `${JSON.stringify({ serverPid: pid, serverUid: uid, runsAs: cluster.runsAs, sqlUser: rows[0].user })}\n`,
  );
  await cluster.stop();
} catch (e) {
  process.stdout.write(
    `${JSON.stringify({ error: { name: e.name, reason: e.reason, message: e.message } })}\n`,
  );
  process.exitCode = 1;
}
