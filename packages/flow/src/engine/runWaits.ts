import { existsSync } from "node:fs";
import { join } from "node:path";
import type { SessionHost } from "../host/sessionHost.js";
import { unansweredReports } from "../steps/inbox.js";
import { DirWatch, type WaitOn, Wakeups } from "../util/wakeups.js";

const STOP = "stop";
const INBOX = "inbox";
const threadKey = (id: string) => `thread:${id}`;
/** With the inbox watched, its whole listing (two directories that grow with the run) at most this often. */
const FULL_LISTING_MIN_MS = 250;

/**
 * The notifications after which a thread reads differently to the engine: a turn that starts or ends,
 * the thread's status, an error. Streamed items and deltas are left out: a subagent that streams would
 * otherwise have its thread read again for every piece of text.
 */
const THREAD_CHANGES = new Set([
  "turn/started",
  "turn/completed",
  "thread/status/changed",
  "thread/started",
  "thread/closed",
  "error",
]);

/**
 * How one run process waits. Each wait ends as soon as what it waits for happens, and after one poll
 * interval at most: a dispatch report the owner's command writes into the inbox (fs.watch on the inbox),
 * a host notification naming the thread, the run stopping. The poll stays the bound because a watch can
 * miss an event and a host need not notify. The inbox listing is shared by every waiting call and read
 * again only after a change (or a poll interval), so N waiting calls cost one listing, not N.
 */
/** A report that is gone, or has its reply. */
function isAnswered(dirs: { inbox: string; replies: string }, name: string): boolean {
  return !existsSync(join(dirs.inbox, name)) || existsSync(join(dirs.replies, name));
}

export class RunWaits {
  private readonly wakeups = new Wakeups();
  private readonly inbox: DirWatch;
  private unsubscribe: (() => void) | null = null;
  private listing: { at: number; names: string[] } | null = null;
  /** Reports the inbox watch named since the last listing (rewritten, or new). */
  private readonly touched = new Set<string>();
  private touchedAll = false;

  constructor(
    private readonly dirs: { inbox: string; replies: string },
    private readonly pollMs: number,
  ) {
    this.inbox = new DirWatch([], this.wakeups, INBOX, (_dir, name) => this.touch(name));
  }

  /** Starts the inbox watch and follows the host's thread notifications; `close` ends both. */
  open(host: SessionHost): void {
    this.inbox.add(this.dirs.inbox);
    this.unsubscribe =
      host.onThreadEvent?.((method, id) => {
        if (THREAD_CHANGES.has(method)) this.wakeups.wake(threadKey(id));
      }) ?? null;
  }

  close(): void {
    this.inbox.close();
    this.unsubscribe?.();
    this.unsubscribe = null;
  }

  /**
   * The unanswered report names (sorted). In between whole listings of the inbox and replies, only the
   * reports the inbox watch named are looked at again; the whole listing (the fallback for a missed
   * event) comes once a poll interval, and no more than four times a second while the watch runs.
   */
  unanswered(): string[] {
    const now = Date.now();
    const every = this.inbox.watching ? Math.max(this.pollMs, FULL_LISTING_MIN_MS) : this.pollMs;
    if (!this.listing || this.touchedAll || now - this.listing.at >= every) {
      const names = unansweredReports(this.dirs.inbox, this.dirs.replies);
      this.listing = { at: now, names };
    } else if (this.touched.size > 0) {
      const names = new Set(this.listing.names);
      for (const name of this.touched) {
        if (isAnswered(this.dirs, name)) names.delete(name);
        else names.add(name);
      }
      this.listing.names = [...names].sort();
    }
    this.touched.clear();
    this.touchedAll = false;
    return this.listing.names;
  }

  /** This process wrote the report's reply: it leaves the listing at hand (the next listing reads it so). */
  answered(name: string): void {
    if (this.listing) this.listing.names = this.listing.names.filter((n) => n !== name);
  }

  private touch(name: string | null): void {
    if (name === null) this.touchedAll = true;
    else if (name.endsWith(".json") && !name.startsWith(".")) this.touched.add(name);
  }

  /** The count of inbox changes: read it before the listing, then nap from it (each caller its own). */
  get inboxVersion(): number {
    return this.inbox.version;
  }

  /**
   * A waiting step's wait: until the inbox changes past `since` (the version its caller read before its
   * listing; without it, a change from now on), the run stops, or a poll interval passes.
   */
  async nap(since?: number): Promise<void> {
    await this.wakeups.wait([{ key: INBOX, since }, { key: STOP }], this.pollMs);
  }

  /** The run's own loop: until the inbox changes past `since` or the owner thread changes, or a poll passes. */
  async pumpNap(owner: string | null, since: number): Promise<void> {
    const on: WaitOn[] = [{ key: INBOX, since }];
    if (owner) on.push({ key: threadKey(owner) });
    await this.wakeups.wait(on, this.pollMs);
  }

  /** The count of the host's notifications that changed the thread: read it before reading the thread. */
  hostVersion(threadId: string): number {
    return this.wakeups.version(threadKey(threadId));
  }

  /** Until the host notifies a change of the thread past `since`, the run stops, or a poll interval passes. */
  hostNap(threadId: string, since: number): Promise<void> {
    return this.wakeups.wait([{ key: threadKey(threadId), since }, { key: STOP }], this.pollMs);
  }

  /** The run is stopping: the waits in course end now (a wait begun later keeps its bound). */
  stopped(): void {
    this.wakeups.wake(STOP);
  }
}
