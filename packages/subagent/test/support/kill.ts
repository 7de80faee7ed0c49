import { readdir, readFile } from "node:fs/promises";

/** SIGKILL every runner process forked by this test process (found in the OS process table). */
export async function killChildRunners(): Promise<number> {
  let killed = 0;
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmd = await readFile(`/proc/${entry}/cmdline`, "utf8");
      if (ppid === process.pid && cmd.includes("runner.js")) {
        process.kill(Number(entry), "SIGKILL");
        killed++;
      }
    } catch {}
  }
  return killed;
}
