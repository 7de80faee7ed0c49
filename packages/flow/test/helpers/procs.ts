import { readdirSync, readFileSync } from "node:fs";

/** Processes whose command line holds `text` (a sandboxed command a subagent runs). */
export function commandsRunning(text: string): number {
  let n = 0;
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").includes(text)) n++;
    } catch {
      // gone meanwhile
    }
  }
  return n;
}
