import { execFile } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

/**
 * What crw writes that holds work or tokens is its user's alone: 0600 files, 0700 directories, whatever the
 * umask. The built `crw` starts a real daemon (`crw daemon start`, embedded PostgreSQL, offline scripted
 * provider) under umask 022, the most common one, which leaves default-mode files 0644.
 */
const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const root = resolve(import.meta.dirname, "../../..");
const holder = mkdtempSync(join(tmpdir(), "crw-file-modes-"));
const dataDir = join(holder, "data");
const at = ["--data-dir", dataDir];

/** `crw <args>` in a shell whose umask is 022. */
async function crw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  try {
    const { stdout, stderr } = await run(
      "/bin/sh",
      ["-c", 'umask 022 && exec "$0" "$@"', process.execPath, bin, ...args],
      { env, cwd: root, timeout: 120_000 },
    );
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

const mode = (path: string) => (statSync(path).mode & 0o777).toString(8);

afterAll(async () => {
  await crw("daemon", "stop", ...at);
  const pidFile = join(dataDir, "postgres", "postmaster.pid");
  if (existsSync(pidFile)) {
    try {
      process.kill(Number(readFileSync(pidFile, "utf8").split("\n")[0]), "SIGKILL");
    } catch {}
  }
  rmSync(holder, { recursive: true, force: true });
}, 120_000);

describe("files that hold work or tokens are the user's alone", () => {
  it("a daemon started under umask 022 on a fresh data dir writes 0700 directories and 0600 files", async () => {
    const started = await crw("daemon", "start", ...at, "--port", "0");
    expect(started.code, started.stderr).toBe(0);
    const created = await crw("session", "create", ...at);
    expect(created.code, created.stderr).toBe(0);
    const session = created.stdout.trim();
    // A child whose answer is above the inline limit (32 KiB): its result is spilled to a file.
    const big = "x".repeat(40_000);
    const delegated = await crw(
      "session",
      "delegate",
      session,
      JSON.stringify({ steps: [{ text: big }] }),
      ...at,
    );
    expect(delegated.code, delegated.stderr).toBe(0);

    const spillRoot = join(dataDir, "spill");
    const sessionDirs = readdirSync(spillRoot);
    expect(sessionDirs.length).toBeGreaterThan(0);
    const spillDir = join(spillRoot, sessionDirs[0] as string);
    const spilled = readdirSync(spillDir);
    expect(spilled.length).toBeGreaterThan(0);
    expect(readFileSync(join(spillDir, spilled[0] as string), "utf8")).toContain(big);
    expect(readFileSync(join(dataDir, "daemon.log"), "utf8")).toContain("daemon ready");

    expect({
      dataDir: mode(dataDir),
      spillRoot: mode(spillRoot),
      spillDir: mode(spillDir),
      spilled: mode(join(spillDir, spilled[0] as string)),
      log: mode(join(dataDir, "daemon.log")),
      ownerToken: mode(join(dataDir, "owner.token")),
      postgresPassword: mode(join(dataDir, "postgres.password")),
      state: mode(join(dataDir, "daemon.state.json")),
      lock: mode(join(dataDir, "daemon.lock")),
    }).toEqual({
      dataDir: "700",
      spillRoot: "700",
      spillDir: "700",
      spilled: "600",
      log: "600",
      ownerToken: "600",
      postgresPassword: "600",
      state: "600",
      lock: "600",
    });
  }, 180_000);

  it("an existing data dir, daemon.log and spill directory with wider modes are narrowed at start, and it is logged", async () => {
    const stopped = await crw("daemon", "stop", ...at);
    expect(stopped.code, stopped.stderr).toBe(0);
    chmodSync(dataDir, 0o755);
    chmodSync(join(dataDir, "daemon.log"), 0o644);
    chmodSync(join(dataDir, "spill"), 0o755);
    const started = await crw("daemon", "start", ...at, "--port", "0");
    expect(started.code, started.stderr).toBe(0);
    expect(mode(dataDir)).toBe("700");
    expect(mode(join(dataDir, "daemon.log"))).toBe("600");
    expect(mode(join(dataDir, "spill"))).toBe("700");
    const narrowed = readFileSync(join(dataDir, "daemon.log"), "utf8")
      .split("\n")
      .flatMap((l) => {
        try {
          return [JSON.parse(l) as { msg?: string; path?: string; from?: string; to?: string }];
        } catch {
          return [];
        }
      })
      .filter((l) => l.msg === "data directory mode narrowed");
    expect(narrowed).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ path: dataDir, from: "755", to: "700" }),
        expect.objectContaining({ path: join(dataDir, "spill"), from: "755", to: "700" }),
      ]),
    );
  }, 180_000);
});
