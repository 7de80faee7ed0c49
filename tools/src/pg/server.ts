import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { type EmbeddedCluster, startEmbeddedCluster } from "@crw/db";

export { freePort } from "@crw/db";

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

async function startEmbedded(): Promise<PostgresServer> {
  const dir = await mkdtemp(join(tmpdir(), "crw-pg-"));
  const dataDir = join(dir, "data");
  let cluster: EmbeddedCluster;
  try {
    cluster = await startEmbeddedCluster({
      dataDir,
      persistent: false,
      // Throw-away data: durability settings off make the suites faster and change no behaviour under test.
      postgresFlags: ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
    });
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
  // A test run that dies without its teardown must not leave a server behind.
  const killOnExit = () => {
    try {
      const pid = Number(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
      if (pid > 0) process.kill(pid, "SIGQUIT");
    } catch {}
  };
  process.once("exit", killOnExit);
  return {
    // through the server's Unix socket, as the daemon reaches its own embedded server: a cheaper round trip
    adminUrl: cluster.localUrl(),
    kind: "embedded",
    stop: async () => {
      process.removeListener("exit", killOnExit);
      await cluster.stop();
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
