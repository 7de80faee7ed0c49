import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TestProcesses } from "@crw/tools/processes";
import { afterAll, describe, expect, it } from "vitest";
import {
  DaemonLockedError,
  type DaemonState,
  lockDataDir,
  lockPath,
  parseLock,
  readState,
  statePath,
  writeState,
} from "../src/lifecycle.js";
import { ownStartTime, parseProcStat, processLiveness, readProcStat } from "../src/processIdentity.js";

const hasProc = readProcStat("self") !== undefined;
const procs = new TestProcesses();
const dirs: string[] = [];

afterAll(() => {
  procs.killAll();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const tempDir = () => {
  const d = mkdtempSync(join(tmpdir(), "crw-liveness-"));
  dirs.push(d);
  return d;
};

const stateOf = (pid: number, processStartTime?: number): DaemonState => ({
  pid,
  host: "127.0.0.1",
  port: 1,
  url: "http://127.0.0.1:1",
  startedAt: new Date().toISOString(),
  database: "embedded",
  ...(processStartTime === undefined ? {} : { processStartTime }),
});

describe("reading /proc/<pid>/stat", () => {
  // 52 fields as Linux writes them; field 22 (start time) is 987654.
  const tail = (state: string) =>
    `${state} 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0`;

  it("reads state and start time after the last parenthesis, whatever the command name holds", () => {
    expect(parseProcStat(`4242 (my (odd) name) ) S) ${tail("S")}\n`)).toEqual({
      state: "S",
      startTime: 987654,
    });
    expect(parseProcStat(`4242 (plain) ${tail("Z")}`)).toEqual({ state: "Z", startTime: 987654 });
  });

  it("gives nothing for text that is not a stat line", () => {
    expect(parseProcStat("")).toBeUndefined();
    expect(parseProcStat("4242 no parentheses S 1 2")).toBeUndefined();
    expect(parseProcStat("4242 (short) S 1 2 3")).toBeUndefined();
  });

  it.runIf(hasProc)("reads this process's own entry the same through self and through its pid", () => {
    const self = readProcStat("self");
    expect(self?.startTime).toBe(ownStartTime());
    expect(readProcStat(process.pid)?.startTime).toBe(self?.startTime);
    expect(["R", "S"]).toContain(self?.state);
  });
});

describe.runIf(hasProc)("process liveness with real processes", () => {
  it("this process with its own start time is alive", () => {
    expect(processLiveness(process.pid, ownStartTime())).toBe("alive");
    expect(processLiveness(process.pid)).toBe("alive");
  });

  it("a zombie is not alive, with or without a recorded start time, though kill(pid, 0) succeeds on it", async () => {
    const pid = await procs.zombie();
    expect(() => process.kill(pid, 0)).not.toThrow();
    expect(processLiveness(pid)).toBe("zombie");
    expect(processLiveness(pid, readProcStat(pid)?.startTime)).toBe("zombie");
  });

  it("a live process that started at another time than recorded is a reused pid", async () => {
    const pid = await procs.live();
    const started = readProcStat(pid)?.startTime as number;
    expect(processLiveness(pid, started)).toBe("alive");
    expect(processLiveness(pid, started + 1)).toBe("reused");
  });

  it("an exited and reaped process is gone", async () => {
    expect(processLiveness(await procs.gone())).toBe("gone");
    expect(processLiveness(0)).toBe("gone");
  });

  it("without procfs it falls back to kill(pid, 0), which cannot see a zombie", async () => {
    const noProc = { procRoot: join(tempDir(), "no-proc") };
    expect(processLiveness(process.pid, 1, noProc)).toBe("alive");
    expect(processLiveness(await procs.zombie(), undefined, noProc)).toBe("alive");
    expect(processLiveness(await procs.gone(), undefined, noProc)).toBe("gone");
  });
});

describe.runIf(hasProc)("the data directory lock", () => {
  const writeLock = (dir: string, text: string) => writeFileSync(lockPath(dir), text, { mode: 0o600 });
  const lockOwner = (dir: string) => parseLock(readFileSync(lockPath(dir), "utf8"));

  it("records this process's pid and start time, and gives the lock back", async () => {
    const dir = tempDir();
    const release = await lockDataDir(dir);
    expect(lockOwner(dir)).toEqual({ pid: process.pid, startTime: ownStartTime() });
    await release();
    await expect(lockDataDir(dir).then((r) => r())).resolves.toBeUndefined();
  });

  it("a lock naming a zombie is taken over, in either file format", async () => {
    for (const text of [
      (pid: number) => `${pid}\n${readProcStat(pid)?.startTime}\n`,
      (pid: number) => `${pid}\n`,
    ]) {
      const dir = tempDir();
      writeLock(dir, text(await procs.zombie()));
      const release = await lockDataDir(dir);
      expect(lockOwner(dir)?.pid).toBe(process.pid);
      await release();
    }
  });

  it("a lock naming a live process with another start time (a reused pid) is taken over", async () => {
    const dir = tempDir();
    const pid = await procs.live();
    writeLock(dir, `${pid}\n${(readProcStat(pid)?.startTime as number) + 7}\n`);
    const release = await lockDataDir(dir);
    expect(lockOwner(dir)?.pid).toBe(process.pid);
    await release();
  });

  it("a lock naming a live process with its start time, or an old lock with only its pid, is held", async () => {
    const pid = await procs.live();
    for (const text of [`${pid}\n${readProcStat(pid)?.startTime}\n`, `${pid}\n`]) {
      const dir = tempDir();
      writeLock(dir, text);
      const refused = await lockDataDir(dir).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(DaemonLockedError);
      expect((refused as DaemonLockedError).pid).toBe(pid);
      expect(readFileSync(lockPath(dir), "utf8")).toBe(text);
    }
  });

  it("a lock naming this very pid with another start time (pids repeat across container runs) is taken over", async () => {
    const dir = tempDir();
    writeLock(dir, `${process.pid}\n${(ownStartTime() as number) + 1}\n`);
    const release = await lockDataDir(dir);
    expect(lockOwner(dir)).toEqual({ pid: process.pid, startTime: ownStartTime() });
    await release();
  });

  it("a second lock from this same process is refused while the first is held", async () => {
    const dir = tempDir();
    const release = await lockDataDir(dir);
    await expect(lockDataDir(dir)).rejects.toBeInstanceOf(DaemonLockedError);
    await release();
  });
});

describe.runIf(hasProc)("the daemon state file", () => {
  it("records this process's start time and reads back as alive", async () => {
    const dir = tempDir();
    await writeState(dir, stateOf(process.pid));
    expect(await readState(dir)).toMatchObject({ pid: process.pid, processStartTime: ownStartTime() });
    expect(await readState(dir, { includeDead: true })).toMatchObject({ liveness: "alive" });
  });

  it("a state file naming a zombie, a reused pid or a gone process names no running daemon, and says which", async () => {
    const live = await procs.live();
    const cases: [DaemonState, string][] = [
      [stateOf(await procs.zombie()), "zombie"],
      [stateOf(live, (readProcStat(live)?.startTime as number) + 1), "reused"],
      [stateOf(await procs.gone()), "gone"],
    ];
    for (const [state, liveness] of cases) {
      const dir = tempDir();
      writeFileSync(statePath(dir), JSON.stringify(state));
      expect(await readState(dir)).toBeUndefined();
      expect(await readState(dir, { includeDead: true })).toMatchObject({ pid: state.pid, liveness });
    }
  });

  it("an old state file without a start time still reads, checked for a zombie only", async () => {
    const dir = tempDir();
    const live = await procs.live();
    writeFileSync(statePath(dir), JSON.stringify(stateOf(live)));
    expect(await readState(dir)).toMatchObject({ pid: live });
    writeFileSync(statePath(dir), JSON.stringify(stateOf(await procs.zombie())));
    expect(await readState(dir)).toBeUndefined();
  });

  it("a torn state file names no daemon", async () => {
    const dir = tempDir();
    writeFileSync(statePath(dir), '{"pid": 12');
    expect(await readState(dir, { includeDead: true })).toBeUndefined();
  });
});
