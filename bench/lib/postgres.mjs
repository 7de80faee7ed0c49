// Shared bench setup: a work directory and a migrated PostgreSQL (an embedded server with durable defaults,
// or DATABASE_URL when set).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Creates a work directory named after `prefix` under the system temp directory, starts an embedded
 * PostgreSQL in it (unless DATABASE_URL is set) through @crw/db's starter and migrates it with `migrate`.
 * Returns { work, url, external, stop }; stop() stops the server and removes the work directory.
 */
export async function startBenchPostgres(prefix, migrate) {
  const work = mkdtempSync(join(tmpdir(), prefix));
  let stopServer = async () => {};
  let url = process.env.DATABASE_URL;
  const external = Boolean(url);
  if (!url) {
    const { startEmbeddedCluster } = await import("../../packages/db/dist/index.js");
    const cluster = await startEmbeddedCluster({ dataDir: join(work, "pg"), persistent: false });
    stopServer = () => cluster.stop();
    url = cluster.url();
  }
  await migrate(url);
  return {
    work,
    url,
    external,
    stop: async () => {
      await stopServer();
      rmSync(work, { recursive: true, force: true });
    },
  };
}
