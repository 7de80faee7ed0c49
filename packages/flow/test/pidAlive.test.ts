import { TestProcesses } from "@crw/tools/processes";
import { afterAll, describe, expect, it } from "vitest";
import { pidAlive } from "../src/run/locks.js";

const procs = new TestProcesses();
afterAll(() => procs.killAll());

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
});
