// The whole machine's CPU over a span of a bench: what every process spent (the bench's own, PostgreSQL's
// backends, the daemon and its runners), from Linux's /proc/stat. On two cores shared by the client and the
// server, the work a unit costs the machine bounds the rate more than any one process's share of it.
import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

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

/** A process's CPU time so far in ms (user + system) from /proc, null when it is gone or off Linux. */
export function processCpuMs(pid) {
  try {
    return statOf(pid).ms;
  } catch {
    return null;
  }
}

function statOf(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // the fields after the command name, which may itself hold spaces and parentheses
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { ppid: Number(f[1]), ms: ((Number(f[11]) + Number(f[12])) * 1000) / 100 };
}

/** The CPU (user + system) of `pid` and every live process below it, in ms, from /proc; null off Linux. */
export function processTreeCpuMs(pid) {
  let entries;
  try {
    entries = readdirSync("/proc").filter((e) => /^\d+$/.test(e));
  } catch {
    return null;
  }
  const stats = new Map();
  for (const entry of entries) {
    try {
      stats.set(Number(entry), statOf(entry));
    } catch {
      // gone meanwhile
    }
  }
  let ms = 0;
  const below = [pid];
  while (below.length > 0) {
    const p = below.pop();
    ms += stats.get(p)?.ms ?? 0;
    for (const [child, s] of stats) if (s.ppid === p) below.push(child);
  }
  return ms;
}

/**
 * This machine's speed at the moment, as the time of a fixed piece of single-threaded JavaScript (JSON
 * written and read back, a hash over it): the median of five rounds after one to warm up, in ms. The host
 * under these machines varies by a third within a day, so a figure compared with another session's is
 * read against this one, taken in the same run.
 */
export function cpuUnitMs() {
  const doc = {
    id: "2f1c4c1e-6f2a-4d7e-9b8a-0c3d5e7f9a1b",
    type: "assistant",
    content: Array.from({ length: 8 }, (_, i) => ({ type: "text", text: `part ${i} `.repeat(12) })),
    usage: { input: 1200, output: 340, cacheRead: 0, cacheWrite: 0, totalTokens: 1540 },
  };
  const round = () => {
    const t0 = performance.now();
    let n = 0;
    for (let i = 0; i < 4000; i++) {
      const text = JSON.stringify({ ...doc, seq: i });
      n += JSON.parse(text).seq;
      n += createHash("sha256").update(text).digest()[0];
    }
    if (n < 0) throw new Error("unreachable");
    return performance.now() - t0;
  };
  round();
  const rounds = Array.from({ length: 5 }, round).sort((a, b) => a - b);
  return Math.round(rounds[2] * 100) / 100;
}
