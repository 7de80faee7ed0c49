import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { runningPostmaster, startEmbeddedCluster, stopPostmaster } from "../src/index.js";

const made: string[] = [];
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<{ one: number }>("select 1 as one")).rows[0]?.one === 1;
  } finally {
    await client.end();
  }
}

describe("a postmaster.pid left by a server that was killed", () => {
  it("names a pid another process has now: not taken for the postmaster, cleared at the next start, and that process never signalled", async () => {
    const dir = mkdtempSync(join(tmpdir(), "crw-stale-lock-"));
    made.push(dir);
    const dataDir = join(dir, "data");
    const password = "stale-lock";
    const first = await startEmbeddedCluster({ dataDir, persistent: true, password });
    let lock: string;
    try {
      lock = readFileSync(join(dataDir, "postmaster.pid"), "utf8");
      // the running server is found by its lock file
      expect((await runningPostmaster(dataDir))?.pid).toBe(Number(lock.split("\n")[0]));
    } finally {
      await first.stop();
    }
    // the lock file as a killed machine leaves it, its pid handed out again to an unrelated process
    // run by the server's own user, whose live process PostgreSQL takes for the owner of its lock file (for
    // root the server runs as a user of its own: the data directory's owner)
    const { uid, gid } = statSync(realpathSync(dataDir));
    const other = spawn("sleep", ["120"], { stdio: "ignore", uid, gid });
    const otherPid = other.pid as number;
    try {
      writeFileSync(join(dataDir, "postmaster.pid"), lock.replace(/^\d+/, String(otherPid)));
      expect(await runningPostmaster(dataDir)).toBeUndefined();
      await stopPostmaster(otherPid, dataDir, 1_000);
      const second = await startEmbeddedCluster({ dataDir, persistent: true, password });
      try {
        expect(await answers(second.localUrl())).toBe(true);
        const running = await runningPostmaster(dataDir);
        expect(running?.pid).not.toBe(otherPid);
        expect(running?.port).toBe(second.port);
      } finally {
        await second.stop();
      }
      expect(other.exitCode).toBeNull();
      expect(other.signalCode).toBeNull();
    } finally {
      other.kill("SIGKILL");
      rmSync(join(dataDir), { recursive: true, force: true });
    }
  }, 60_000);
});
