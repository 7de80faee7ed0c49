import { join } from "node:path";
import type { LightRow } from "../run/lightJournal.js";
import type { RunPaths } from "../run/paths.js";
import { DirWatch } from "../util/wakeups.js";

/**
 * What the owner's commands wait on while a run's process works: its directory (the journal, the locks),
 * its steps directory (a new call's directory) and the directories of its open calls (their step and
 * close files), so `next --wait` answers as soon as a step lands. Watches stay few: the open calls are
 * the run's pool at most. Every wait keeps its poll, and the caller closes the watch.
 */
export class RunWatch {
  private readonly watch: DirWatch;

  constructor(private readonly paths: RunPaths) {
    this.watch = new DirWatch([paths.dir, paths.steps]);
  }

  /** Watches the directories of the calls the rows leave open (a prepared row, no terminal row). */
  follow(rows: readonly LightRow[]): void {
    const open = new Set<string>();
    for (const r of rows) {
      if (typeof r.call !== "string") continue;
      if (r.type === "prepared") open.add(r.call);
      else if (r.type === "completed" || r.type === "null_model") open.delete(r.call);
    }
    this.watch.add(this.paths.steps); // made by the run's process after this watch began
    for (const call of open) this.watch.add(join(this.paths.steps, call));
  }

  get version(): number {
    return this.watch.version;
  }

  /** Until a change past `since`, or `ms` pass. */
  wait(since: number, ms: number): Promise<void> {
    return this.watch.wait(since, ms);
  }

  close(): void {
    this.watch.close();
  }
}
