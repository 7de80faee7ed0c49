import { chmodSync, lstatSync, mkdirSync, mkdtempSync, readlinkSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { runningPostmaster, socketDirFor, startEmbeddedCluster } from "../src/index.js";

const made: string[] = [];
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});
const privateDir = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), "crw-socket-"));
  made.push(dir);
  return join(dir, name);
};
/** Where the cluster really lives: for root the data directory is a link to its server user's place. */
const realDir = (dataDir: string) =>
  lstatSync(dataDir).isSymbolicLink() ? resolve(dirname(dataDir), readlinkSync(dataDir)) : dataDir;

async function serverAddress(url: string): Promise<string | null> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (
      (await client.query<{ a: string | null }>("select inet_server_addr()::text as a")).rows[0]?.a ?? null
    );
  } finally {
    await client.end();
  }
}

describe("the embedded server's Unix socket", () => {
  it("lives in the private data directory, and a local client reaches the server through it", async () => {
    const dataDir = privateDir("data");
    const cluster = await startEmbeddedCluster({ dataDir, persistent: false });
    try {
      const real = realDir(dataDir);
      expect(cluster.socketDir).toBe(real);
      expect(statSync(real).mode & 0o777).toBe(0o700);
      expect(statSync(join(real, `.s.PGSQL.${cluster.port}`)).isSocket()).toBe(true);
      // no address: the connection came through the socket, not TCP
      expect(await serverAddress(cluster.localUrl())).toBeNull();
      expect(await serverAddress(cluster.url())).toBe("127.0.0.1/32");
      // a daemon adopting a server left running finds the socket in its pid file
      expect((await runningPostmaster(dataDir))?.socketDir).toBe(real);
    } finally {
      await cluster.stop();
    }
  });

  it("is left out when its path would be too long for a socket: the server listens on TCP alone", async () => {
    expect(socketDirFor(`/tmp/${"d".repeat(80)}`, 5432)).toBe(`/tmp/${"d".repeat(80)}`);
    expect(socketDirFor(`/tmp/${"d".repeat(100)}`, 5432)).toBeNull();
    // Directories open to others: root's server user reaches the data directory where it is (no short
    // mapped place), so the long path is the one the server gets.
    const deep = privateDir("x".repeat(60));
    mkdirSync(deep, { mode: 0o755 });
    chmodSync(dirname(deep), 0o755);
    const dataDir = join(deep, "y".repeat(60));
    const cluster = await startEmbeddedCluster({ dataDir, persistent: false });
    try {
      expect(realDir(dataDir)).toBe(dataDir);
      expect(cluster.socketDir).toBeNull();
      expect(cluster.localUrl()).toBe(cluster.url());
      expect((await runningPostmaster(dataDir))?.socketDir).toBeNull();
      expect(await serverAddress(cluster.localUrl())).toBe("127.0.0.1/32");
    } finally {
      await cluster.stop();
    }
  });
});
