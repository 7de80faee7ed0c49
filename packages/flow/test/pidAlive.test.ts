import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TestProcesses } from "@crw/tools/processes";
import { afterAll, describe, expect, it } from "vitest";
import { lockHolder, readLock, tryLock, unlock } from "../src/run/locks.js";
import { pidAlive } from "../src/util/liveness.js";

const procs = new TestProcesses();
const dir = mkdtempSync(join(tmpdir(), "crw-locks-"));
afterAll(() => {
  procs.killAll();
  rmSync(dir, { recursive: true, force: true });
});

describe("whether a lock holder's pid runs", () => {
  it("a zombie (exited, not reaped yet) is not alive, though kill(pid, 0) still succeeds on it", async () => {
    const zombie = await procs.zombie();
    expect(() => process.kill(zombie, 0)).not.toThrow();
    expect(TestProcesses.stat(zombie)?.state).toBe("Z");
    expect(pidAlive(zombie)).toBe(false);
  });

  it("a running process is alive; a pid that is gone and a pid that is no pid are not", async () => {
    expect(pidAlive(await procs.live())).toBe(true);
    expect(pidAlive(process.pid)).toBe(true);
    expect(pidAlive(await procs.gone())).toBe(false);
    for (const bad of [0, -1, 1.5, Number.NaN]) expect(pidAlive(bad)).toBe(false);
  });

  it("a pid another process has now is not the holder that started at the recorded time", async () => {
    const live = await procs.live();
    const started = TestProcesses.stat(live)?.startTime as number;
    expect(pidAlive(live, started)).toBe(true);
    expect(pidAlive(live, started - 1)).toBe(false);
    // a lock written without a start time (an older crw) is judged by the pid alone
    expect(pidAlive(live)).toBe(true);
  });
});

describe("a run's lock file", () => {
  it("records when its holder started, and is let go when its pid has since gone to another process", async () => {
    const path = join(dir, "run.lock");
    expect(tryLock(path)).toBe(true);
    expect(readLock(path)).toEqual({ pid: process.pid, started: TestProcesses.stat(process.pid)?.startTime });
    expect(lockHolder(path)?.pid).toBe(process.pid);
    unlock(path);
    // a machine killed while a run process held the lock: after the restart another process has its pid
    const other = await procs.live();
    const otherStart = TestProcesses.stat(other)?.startTime as number;
    writeFileSync(path, JSON.stringify({ pid: other, started: otherStart - 100 }));
    expect(lockHolder(path)).toBeNull();
    expect(tryLock(path)).toBe(true);
    expect(readLock(path)?.pid).toBe(process.pid);
    unlock(path);
    // the same pid with its own start time holds the lock
    writeFileSync(path, JSON.stringify({ pid: other, started: otherStart }));
    expect(lockHolder(path)?.pid).toBe(other);
    expect(tryLock(path)).toBe(false);
  });
});
