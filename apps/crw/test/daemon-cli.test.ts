import { execFile, spawn } from "node:child_process";
import {
  existsSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { MCP_TOOLS_SERVER } from "@crw/tools/mcp";
import { alive } from "@crw/tools/processes";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const dataDir = mkdtempSync(join(tmpdir(), "crw-daemon-cli-"));

async function crw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return crwWith({}, ...args);
}

async function crwWith(
  extra: NodeJS.ProcessEnv,
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env, ...extra };
  delete env.DATABASE_URL; // this suite is about the embedded cluster in the data directory
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, ...args], { env, timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

const postmasterPid = (): number | undefined => {
  const file = join(dataDir, "postgres", "postmaster.pid");
  return existsSync(file) ? Number(readFileSync(file, "utf8").split("\n")[0]) : undefined;
};

afterAll(() => {
  const pid = postmasterPid();
  if (alive(pid)) process.kill(pid as number, "SIGKILL");
  rmSync(dataDir, { recursive: true, force: true });
});

describe("crw daemon start | status | stop with the embedded PostgreSQL", () => {
  let firstPid = 0;

  it("start runs the daemon in the background on its own embedded PostgreSQL and waits until it is ready", async () => {
    const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0", "--json");
    expect(r.code, r.stderr).toBe(0);
    const started = JSON.parse(r.stdout) as { pid: number; url: string; database: string };
    expect(started.database).toBe("embedded");
    firstPid = started.pid;
    const s = await crw("daemon", "status", "--data-dir", dataDir, "--json");
    expect(s.code).toBe(0);
    expect(JSON.parse(s.stdout)).toMatchObject({
      running: true,
      health: { status: "ok", database: { kind: "embedded", ok: true } },
    });
  });

  it("after a SIGKILL the next start adopts the cluster the dead daemon left running, with its rows", async () => {
    const token = readFileSync(join(dataDir, "owner.token"), "utf8").trim();
    process.kill(firstPid, "SIGKILL");
    while (alive(firstPid)) await new Promise((r) => setTimeout(r, 20));
    expect(alive(postmasterPid())).toBe(true);
    expect((await crw("daemon", "status", "--data-dir", dataDir)).code).toBe(1);
    const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0", "--json");
    expect(r.code, r.stderr).toBe(0);
    const s = JSON.parse((await crw("daemon", "status", "--data-dir", dataDir, "--json")).stdout);
    expect(s.health.database.kind).toBe("adopted");
    expect(readFileSync(join(dataDir, "owner.token"), "utf8").trim()).toBe(token);
  });

  it("stop ends the daemon and its PostgreSQL; a second stop says none runs", async () => {
    const pg = postmasterPid();
    const r = await crw("daemon", "stop", "--data-dir", dataDir);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/stopped/);
    expect(alive(pg)).toBe(false);
    const again = await crw("daemon", "stop", "--data-dir", dataDir);
    expect(again.stdout).toMatch(/no daemon runs/);
  });

  it("a pid file a killed machine left, its pid now another process's, is not adopted: the next start runs its own server and never signals that process", async () => {
    // a restart hands out pids again: the dead server's lock file names one that a live process now has
    // a process of the server's own user (root's server runs as the data directory's owner): PostgreSQL takes
    // its live pid for the holder of the lock file
    const { uid, gid } = statSync(realpathSync(join(dataDir, "postgres")));
    const other = spawn("sleep", ["120"], { stdio: "ignore", uid, gid });
    try {
      const otherPid = other.pid as number;
      writeFileSync(join(dataDir, "postgres", "postmaster.pid"), `${otherPid}\n${dataDir}\n0\n5432\n\n`);
      const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0", "--json");
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).database).toBe("embedded");
      expect(postmasterPid()).not.toBe(otherPid);
      const stopped = await crw("daemon", "stop", "--data-dir", dataDir);
      expect(stopped.code, stopped.stderr).toBe(0);
      expect(other.exitCode).toBeNull();
      expect(other.signalCode).toBeNull();
      expect(alive(otherPid)).toBe(true);
    } finally {
      other.kill("SIGKILL");
    }
  });

  it("bad flags are input errors (exit 2) that point at the help", async () => {
    const r = await crw("daemon", "start", "--port", "eighty");
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--port/);
  });

  it("an MCP server that cannot start fails the start: exit 1, and the log names the server and its error", async () => {
    const config = join(dataDir, "broken-mcp.json");
    writeFileSync(
      config,
      JSON.stringify({
        mcp: {
          servers: {
            broken: {
              command: process.execPath,
              args: [MCP_TOOLS_SERVER],
              env: { CRW_MCP_FAIL: "start" },
            },
          },
        },
      }),
    );
    const r = await crw("daemon", "start", "--data-dir", dataDir, "--config", config, "--port", "0");
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /the daemon exited during start \(code 1\): .*MCP server broken[\s\S]*see .*daemon\.log/,
    );
    const log = readFileSync(join(dataDir, "daemon.log"), "utf8");
    expect(log).toMatch(/MCP server broken .*could not start.*refusing to start/);
    expect(log).toContain('"code":"start_failed"');
    expect((await crw("daemon", "status", "--data-dir", dataDir)).code).toBe(1);
  });

  it.runIf(process.getuid?.() === 0)(
    "a PostgreSQL that cannot start fails the start with its reason on stderr, exit 1, nothing left running",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "crw-daemon-nopg-"));
      try {
        const r = await crwWith(
          { CRW_POSTGRES_USER: "crw-no-such-user" },
          "daemon",
          "start",
          "--data-dir",
          dir,
          "--port",
          "0",
        );
        expect(r.code).toBe(1);
        expect(r.stderr).toMatch(
          /exited during start \(code 1\): .*no user 'crw-no-such-user'.*CRW_POSTGRES_USER/,
        );
        expect(r.stderr).not.toMatch(/Unhandled|EACCES/);
        expect((await crw("daemon", "status", "--data-dir", dir)).code).toBe(1);
        expect(existsSync(join(dir, "daemon.state.json"))).toBe(false);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
