import { type FSWatcher, watch } from "node:fs";

/** One key a wait ends on; `since` is the key's version the caller read its state at. */
export interface WaitOn {
  key: string;
  /** Without it, only a wake after the wait began ends it. */
  since?: number;
}

/**
 * Keyed wake-ups for waits whose event source shares the process (an fs.watch callback, a host
 * notification, the run stopping). Each key counts its wakes: a caller that read its state at version v
 * and then waits from v returns at once when a wake came in between, so an event that lands between the
 * read and the wait is never lost. Every wait is bounded by its own timeout, and its timer is cleared
 * when it ends, so a finished wait holds no handle.
 */
export class Wakeups {
  private readonly versions = new Map<string, number>();
  private readonly waiters = new Map<string, Set<() => void>>();

  version(key: string): number {
    return this.versions.get(key) ?? 0;
  }

  wake(key: string): void {
    this.versions.set(key, this.version(key) + 1);
    const set = this.waiters.get(key);
    if (set) for (const w of [...set]) w();
  }

  /** Waits until one of `on` is woken past its `since`, or `ms` pass. */
  wait(on: readonly WaitOn[], ms: number): Promise<void> {
    if (on.some((o) => o.since !== undefined && this.version(o.key) !== o.since)) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        for (const o of on) {
          const set = this.waiters.get(o.key);
          set?.delete(done);
          if (set?.size === 0) this.waiters.delete(o.key);
        }
        resolve();
      };
      const timer = setTimeout(done, ms);
      for (const o of on) {
        const set = this.waiters.get(o.key) ?? new Set();
        set.add(done);
        this.waiters.set(o.key, set);
      }
    });
  }
}

/**
 * Watches directories written by other processes: a change in any of them wakes the waits, and a wait is
 * still bounded by its poll (a watch can miss events, and some file systems give none: then each wait
 * costs its poll, never more). A directory that cannot be watched is polled alone. Close it on every path.
 */
export class DirWatch {
  private readonly watchers = new Map<string, FSWatcher>();

  /**
   * A change wakes `key` of `wakeups` (its own by default; a shared one lets a wait end on other keys too)
   * after `onName` heard which entry changed (null: the watch did not say).
   */
  constructor(
    dirs: readonly string[] = [],
    readonly wakeups: Wakeups = new Wakeups(),
    readonly key = "change",
    private readonly onName: ((dir: string, name: string | null) => void) | null = null,
  ) {
    for (const dir of dirs) this.add(dir);
  }

  /** Watches one more directory (again: nothing new). */
  add(dir: string): void {
    if (this.watchers.has(dir)) return;
    try {
      const w = watch(dir, { persistent: false }, (_event, name) => {
        this.onName?.(dir, name ? String(name) : null);
        this.wakeups.wake(this.key);
      });
      w.on("error", () => this.remove(dir));
      this.watchers.set(dir, w);
    } catch {
      // not there (yet) or not watchable: the poll reads it
    }
  }

  remove(dir: string): void {
    this.watchers.get(dir)?.close();
    this.watchers.delete(dir);
  }

  /** Whether some directory is watched (else every change is left to the poll). */
  get watching(): boolean {
    return this.watchers.size > 0;
  }

  /** The count of changes seen: read it before reading the directories, then wait from it. */
  get version(): number {
    return this.wakeups.version(this.key);
  }

  /** Until a change past `since`, or `ms` pass. */
  wait(since: number, ms: number): Promise<void> {
    return this.wakeups.wait([{ key: this.key, since }], ms);
  }

  close(): void {
    for (const w of this.watchers.values()) w.close();
    this.watchers.clear();
  }
}
