import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { alive, TestProcesses } from "@crw/tools/processes";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const bin = resolve(import.meta.dirname, "../bin/crw.mjs");
const dataDir = mkdtempSync(join(tmpdir(), "crw-daemon-liveness-"));
const hasProc = existsSync("/proc/self/stat");

async function crw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env.DATABASE_URL; // the daemon runs on the embedded cluster in the data directory
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, ...args], { env, timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

const procs = new TestProcesses();
const procStat = (pid: number) => TestProcesses.stat(pid);

/** A port nothing listens on: bound once by the system's choice, then closed. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

/** Writes `daemon.lock` and `daemon.state.json` as a daemon with this pid and start time would have. */
function recordDaemon(pid: number, startTime: number | undefined, port = 1): void {
  writeFileSync(
    join(dataDir, "daemon.lock"),
    startTime === undefined ? `${pid}\n` : `${pid}\n${startTime}\n`,
    {
      mode: 0o600,
    },
  );
  const state = {
    pid,
    host: "127.0.0.1",
    port,
    url: `http://127.0.0.1:${port}`,
    startedAt: new Date().toISOString(),
    database: "embedded",
    ...(startTime === undefined ? {} : { processStartTime: startTime }),
  };
  writeFileSync(join(dataDir, "daemon.state.json"), JSON.stringify(state), { mode: 0o600 });
}

const lockPid = () => Number(readFileSync(join(dataDir, "daemon.lock"), "utf8").split("\n")[0]);
const postmasterPid = (): number | undefined => {
  const file = join(dataDir, "postgres", "postmaster.pid");
  return existsSync(file) ? Number(readFileSync(file, "utf8").split("\n")[0]) : undefined;
};

/** `crw daemon start` takes over the stale record, the new daemon answers /health; then it is stopped. */
async function startsOverStaleRecord(recordedPid: number): Promise<string> {
  const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0", "--json");
  try {
    expect(r.code, r.stderr).toBe(0);
    const started = JSON.parse(r.stdout) as { pid: number; url: string; already?: boolean };
    expect(started.already).toBeUndefined();
    expect(started.pid).not.toBe(recordedPid);
    expect(lockPid()).toBe(started.pid);
    const health = (await (await fetch(`${started.url}/health`)).json()) as { status: string };
    expect(health.status).toBe("ok");
    return r.stderr;
  } finally {
    const stopped = await crw("daemon", "stop", "--data-dir", dataDir);
    expect(stopped.code, stopped.stderr).toBe(0);
  }
}

afterAll(() => {
  procs.killAll();
  const pg = postmasterPid();
  if (alive(pg)) process.kill(pg as number, "SIGKILL");
  rmSync(dataDir, { recursive: true, force: true });
});

describe.runIf(hasProc)("crw daemon start and status when the recorded daemon is not what it seems", () => {
  it("a live process recorded as the daemon that does not answer /health: start exits 1 and says what to do", async () => {
    const pid = await procs.live();
    recordDaemon(pid, procStat(pid)?.startTime, await closedPort());
    const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0");
    expect(r.code).toBe(1);
    expect(r.stdout).not.toMatch(/already running/);
    expect(r.stderr).toMatch(
      new RegExp(
        `a daemon process \\(pid ${pid}\\) runs on .* but does not answer /health .*crw daemon stop`,
      ),
    );
    expect(alive(pid)).toBe(true);
    expect(lockPid()).toBe(pid);
    const s = await crw("daemon", "status", "--data-dir", dataDir);
    expect(s.code).toBe(1);
    expect(s.stdout).toMatch(/not answering/);
  });

  it("a recorded daemon whose port accepts but never answers: start gives up within its bound and exits 1", async () => {
    const sockets: Socket[] = [];
    const silent: Server = createServer((s) => sockets.push(s));
    await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
    try {
      const pid = await procs.live();
      recordDaemon(pid, procStat(pid)?.startTime, (silent.address() as { port: number }).port);
      const began = Date.now();
      const r = await crw("daemon", "start", "--data-dir", dataDir, "--port", "0");
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/does not answer \/health .* within 5 s/);
      expect(Date.now() - began).toBeLessThan(20_000);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => silent.close(r));
    }
  });

  it("a zombie recorded as the daemon: status says so, and start runs a new daemon over its lock", async () => {
    const pid = await procs.zombie();
    recordDaemon(pid, procStat(pid)?.startTime);
    const s = await crw("daemon", "status", "--data-dir", dataDir);
    expect(s.code).toBe(1);
    expect(s.stdout).toMatch(new RegExp(`recorded daemon \\(pid ${pid}\\) is a zombie`));
    const json = JSON.parse((await crw("daemon", "status", "--data-dir", dataDir, "--json")).stdout);
    expect(json).toMatchObject({ running: false, recorded: { pid, liveness: "zombie" }, health: null });
    expect(await startsOverStaleRecord(pid)).toMatch(/is a zombie.*starting a new one/);
  });

  it("an old lock and state file (no start time) naming a zombie: start runs a new daemon", async () => {
    const pid = await procs.zombie();
    recordDaemon(pid, undefined);
    await startsOverStaleRecord(pid);
  });

  it("a reused pid (a live unrelated process with another start time): treated as dead, start works, the process is left alone", async () => {
    const pid = await procs.live();
    recordDaemon(pid, (procStat(pid)?.startTime as number) + 1);
    const s = await crw("daemon", "status", "--data-dir", dataDir);
    expect(s.stdout).toMatch(/pid \d+\) is gone: that pid now belongs to another process/);
    await startsOverStaleRecord(pid);
    expect(alive(pid)).toBe(true);
  });

  it("a stale lock and state file whose process is gone: status says gone, start works", async () => {
    const pid = await procs.gone();
    recordDaemon(pid, 12345);
    const s = await crw("daemon", "status", "--data-dir", dataDir);
    expect(s.stdout).toMatch(new RegExp(`pid ${pid}\\) is gone: it exited without cleaning up`));
    await startsOverStaleRecord(pid);
  });
});
