import { join } from "node:path";
import type { OwnerView } from "../run/ownerView.js";
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

  /** Watches the directories of the calls the run leaves open (a prepared row, no terminal row). */
  follow(view: OwnerView): void {
    this.watch.add(this.paths.steps); // made by the run's process after this watch began
    for (const call of Object.keys(view.calls)) this.watch.add(join(this.paths.steps, call));
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
