import { describe, expect, it } from "vitest";
import { timeWithin, timeWithinAsync } from "../src/timing/index.js";

/** Spends `ms` of this process's CPU time (a case's time is CPU time: a clock-bound loop may get less). */
const busy = (ms: number) => {
  const cpu = () => {
    const { user, system } = process.cpuUsage();
    return (user + system) / 1000;
  };
  const end = cpu() + ms;
  while (cpu() < end);
};

describe("time bounds of deterministic cases", () => {
  it("a case slow on its first run only is timed by its fastest run", () => {
    let calls = 0;
    const timed = timeWithin(() => {
      calls++;
      if (calls === 1) busy(60);
      return calls;
    }, 30);
    expect(timed.runs).toBe(2);
    expect(timed.ms).toBeLessThan(30);
    expect(timed.outcome).toEqual({ ok: 2 });
  });

  it("a case slow on every run stays over its bound after the last try", () => {
    const timed = timeWithin(() => busy(20), 10, 3);
    expect(timed.runs).toBe(3);
    expect(timed.ms).toBeGreaterThanOrEqual(10);
  });

  it("a case within its bound runs once, and a throw is its outcome", async () => {
    const error = new Error("refused");
    const timed = timeWithin(() => {
      throw error;
    }, 1_000);
    expect(timed).toMatchObject({ runs: 1, outcome: { error } });
    const later = await timeWithinAsync(async () => "read", 1_000);
    expect(later).toMatchObject({ runs: 1, outcome: { ok: "read" } });
  });
});
