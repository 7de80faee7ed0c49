// The whole machine's CPU over a span of a bench: what every process spent (the bench's own, PostgreSQL's
// backends, the daemon and its runners), from Linux's /proc/stat. On two cores shared by the client and the
// server, the work a unit costs the machine bounds the rate more than any one process's share of it.
import { readFileSync } from "node:fs";

/** The machine's busy CPU time so far in ms (user, nice, system, irq, softirq, steal), null off Linux. */
export function machineBusyMs() {
  try {
    const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
    const ticks = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    return (ticks * 1000) / 100;
  } catch {
    return null;
  }
}

/** Starts a span; `perUnit(n)` answers the machine's busy ms per unit since then (null off Linux). */
export function machineSpan() {
  const before = machineBusyMs();
  return {
    perUnit(units) {
      const now = machineBusyMs();
      if (before === null || now === null || units <= 0) return null;
      return Math.round(((now - before) / units) * 100) / 100;
    },
  };
}
