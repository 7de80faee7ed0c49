import { performance } from "node:perf_hooks";
import type { SessionHost } from "../host/sessionHost.js";
import type { JournalRow, NewRow } from "../journal/rows.js";
import { digestOf } from "../util/canonical.js";
import type { FlowEvent } from "./runContext.js";

/** SessionConfig.WakeAfter / RenotifyMax / UnresponsiveAfter. */
export interface WakeConfig {
  wakeAfterMs: number;
  renotifyMaxMs: number;
  unresponsiveAfterMs: number;
}

export const DEFAULT_WAKE: WakeConfig = {
  wakeAfterMs: 15 * 60_000,
  renotifyMaxMs: 60 * 60_000,
  unresponsiveAfterMs: 2 * 60 * 60_000,
};

export interface WakeContext {
  runId: string;
  owner: string;
  host: SessionHost;
  rows(): readonly JournalRow[];
  append(rows: NewRow[]): unknown;
  /** The command the owner takes the steps with, named in the message. */
  nextCommand: string;
  /** The count of the host's notifications that changed the thread (none: the status is read each time). */
  hostVersion?(threadId: string): number;
  /** How long a status read stays good while the host notifies no change of the owner (the poll). */
  statusFreshMs?: number;
}

/**
 * Wakes the owner thread while steps wait for it. When a step is published, a session_step_waiting message
 * is staged for the owner thread and delivered through the host: a new turn on an idle thread, a resume and
 * a turn on a notLoaded one, after the current turn on a busy (active) one (held here until the thread is
 * no longer active; a later round's wake takes the place of one still held, and one the owner no longer
 * needs because it took the steps meanwhile is dropped). Each delivery, or why there was none, is a
 * message_delivery row. The wake's id is (run, process, batch): the batch is the set of
 * waiting markers, the run's n-th process wakes under `<batch>/e<n>` (the first under `<batch>`), so the
 * same steps staged again by one process are one message, and a resume stages new ones. While steps wait
 * with no dispatched report the owner is notified again after WakeAfter, each interval twice the one
 * before up to RenotifyMax, whatever its status; after UnresponsiveAfter the session_unresponsive
 * escalation is written once and the run goes on waiting. Every wake is a session_wake row.
 */
export class OwnerWaker {
  private readonly waiting = new Map<string, { call: string; op: string }>();
  /** The owner's status as last read, and the owner thread's notification count then. */
  private statusSeen: { at: number; version: number; status: string } | null = null;
  private firstAt: number | null = null;
  private lastAt = 0;
  private interval: number;
  private renotify = 0;
  private escalated = false;
  private published = false;
  private staged: Set<string> | null = null;
  private running = false;
  /**
   * A wake staged while the owner was busy: delivered once its current turn has ended. The publish's wake
   * has no row yet (`unwritten`, written with its delivery: an owner that takes the steps in its current
   * turn needed no wake, and none is recorded); a renotification's row is written when it is staged.
   */
  private pending: {
    wakeId: string;
    text: string;
    unwritten: (NewRow & { type: "session_wake" }) | null;
  } | null = null;

  constructor(
    private readonly ctx: WakeContext,
    private readonly config: WakeConfig,
    /** A monotonic clock: a wall clock set forward must not make the owner look unresponsive. */
    private readonly now: () => number = () => performance.now(),
  ) {
    this.interval = config.wakeAfterMs;
  }

  /** Follows the run's events: a published step waits until it is bound or its call ends. */
  onEvent(event: FlowEvent): void {
    if (event.type === "step_published") {
      this.waiting.set(event.marker, { call: event.call, op: opOfMarker(event.marker) });
      this.published = true;
      if (this.firstAt === null) {
        this.firstAt = this.now();
        this.lastAt = this.firstAt;
      }
      // the wake goes out at once, not at the next poll round (the round stays the bound)
      setImmediate(() => {
        this.tick().catch(() => {});
      });
    } else if (event.type === "bound") {
      this.waiting.delete(event.marker);
    } else if (event.type === "call_ended") {
      for (const [marker, w] of this.waiting) if (w.call === event.call) this.waiting.delete(marker);
    }
    if (this.waiting.size === 0) this.reset();
  }

  private reset(): void {
    // the owner took the steps in its current turn: the message has nothing to say any more
    this.dropPending("active", "no_step_waiting");
    this.firstAt = null;
    this.renotify = 0;
    this.interval = this.config.wakeAfterMs;
    this.escalated = false;
    this.published = false;
  }

  /**
   * Gives up the wake held for after the owner's turn: one already recorded gets its undelivered
   * message_delivery row; one never recorded (`unwritten`) goes without a row.
   */
  private dropPending(ownerStatus: string, reason: string): void {
    const held = this.pending;
    this.pending = null;
    if (!held || held.unwritten) return;
    this.ctx.append([
      {
        type: "message_delivery",
        wake_id: held.wakeId,
        owner: this.ctx.owner,
        delivered: false,
        owner_status: ownerStatus,
        reason,
      },
    ]);
  }

  /** One round: called from the run's poll loop; never throws (a host failure is the row's error). */
  async tick(): Promise<void> {
    if (this.running || this.waiting.size === 0 || this.firstAt === null) return;
    this.running = true;
    try {
      const now = this.now();
      if (this.pending) {
        // a busy owner gets the message after its current turn
        const status = await this.ownerStatus();
        if (status === "idle" || status === "notLoaded") {
          const { wakeId, text, unwritten } = this.pending;
          this.pending = null;
          await this.deliver(wakeId, text, status, unwritten);
        }
      }
      if (this.published) {
        this.published = false;
        const status = await this.ownerStatus();
        if (status === "idle" || status === "notLoaded" || status === "active")
          await this.stage(status, 0, now);
      }
      if (now - this.lastAt >= this.interval) {
        this.renotify++;
        this.lastAt = now;
        this.interval = Math.min(this.interval * 2, this.config.renotifyMaxMs);
        await this.stage(await this.ownerStatus(), this.renotify, now);
      }
      if (!this.escalated && now - this.firstAt >= this.config.unresponsiveAfterMs) {
        this.escalated = true;
        this.ctx.append([
          {
            type: "escalation",
            reason: "session_unresponsive",
            owner: this.ctx.owner,
            ops: this.ops(),
            batch: this.batch(),
            waiting_seconds: this.waitingSeconds(now),
          },
        ]);
      }
    } finally {
      this.running = false;
    }
  }

  private ops(): string[] {
    return [...new Set([...this.waiting.values()].map((w) => w.op))].sort();
  }

  private batch(): string {
    return digestOf([...this.waiting.keys()].sort())
      .replace(/^sha256:/, "")
      .slice(0, 16);
  }

  private waitingSeconds(now: number): number {
    return Math.max(0, Math.round((now - (this.firstAt ?? now)) / 1000));
  }

  /**
   * The owner's status alone: its turns (every spawn the owner made) are not read for it. A status read
   * holds until the host notifies a change of the owner thread, for one poll interval at most (a host need
   * not notify), and never past a turn this waker starts on the owner.
   */
  private async ownerStatus(): Promise<string> {
    const version = this.ctx.hostVersion?.(this.ctx.owner);
    const now = this.now();
    const seen = this.statusSeen;
    if (seen && seen.version === version && now - seen.at < (this.ctx.statusFreshMs ?? 0)) return seen.status;
    const host = this.ctx.host;
    const r = host.readStatus
      ? await host.readStatus(this.ctx.owner)
      : await host
          .readThread(this.ctx.owner)
          .then((t) => (t.ok ? { ok: true as const, value: t.value.status } : t));
    this.statusSeen = r.ok && version !== undefined ? { at: now, version, status: r.value.type } : null;
    return r.ok ? r.value.type : `unreadable:${r.reason}`;
  }

  // The run's processes so far, this one last: only this process appends to the journal while it runs,
  // so its started rows are counted once.
  private processCount: number | null = null;
  private processN(): number {
    this.processCount ??= Math.max(1, this.ctx.rows().filter((r) => r.type === "started").length);
    return this.processCount;
  }

  private async stage(ownerStatus: string, renotify: number, now: number): Promise<void> {
    if (!this.staged) {
      this.staged = new Set();
      for (const r of this.ctx.rows()) if (r.type === "session_wake" && r.staged) this.staged.add(r.wake_id);
    }
    const batch = this.batch();
    const n = this.processN();
    const wakeId = `run:${this.ctx.runId}/${batch}${n > 1 ? `/e${n}` : ""}${renotify > 0 ? `/r${renotify}` : ""}`;
    const ops = this.ops();
    const row = {
      type: "session_wake" as const,
      batch,
      wake_id: wakeId,
      renotify,
      ops,
      owner: this.ctx.owner,
      owner_status: ownerStatus,
      waiting_seconds: this.waitingSeconds(now),
    };
    if (this.staged.has(wakeId)) {
      this.ctx.append([{ ...row, staged: false, reason: "already_held" }]);
      return;
    }
    const text = this.message(ops, wakeId);
    if (ownerStatus === "active") {
      // a busy owner: staged now, delivered after its current turn (a later round's wake takes the place
      // of one still undelivered); the publish's wake is recorded with its delivery
      const staged = { ...row, staged: true, delivery: "after_turn" as const };
      if (renotify === 0) {
        this.pending = { wakeId, text, unwritten: staged };
        return;
      }
      this.dropPending(ownerStatus, `superseded by ${wakeId}`);
      this.staged.add(wakeId);
      this.pending = { wakeId, text, unwritten: null };
      this.ctx.append([staged]);
      return;
    }
    const delivery = ownerStatus === "notLoaded" ? "resume_and_turn" : "new_turn";
    this.statusSeen = null;
    const r = await this.ctx.host.startTurn(this.ctx.owner, text);
    if (r.ok) {
      this.staged.add(wakeId);
      // a wake that went out takes the place of one still held for after a turn
      this.dropPending(ownerStatus, `superseded by ${wakeId}`);
      this.ctx.append([
        { ...row, staged: true, delivery },
        {
          type: "message_delivery",
          wake_id: wakeId,
          owner: this.ctx.owner,
          delivered: true,
          turn_id: r.value.turnId,
          owner_status: ownerStatus,
        },
      ]);
    } else {
      this.ctx.append([{ ...row, staged: false, error: `${r.reason}: ${r.message}` }]);
    }
  }

  /** A wake staged while the owner was busy goes out as a new turn once that turn has ended. */
  private async deliver(
    wakeId: string,
    text: string,
    ownerStatus: string,
    unwritten: (NewRow & { type: "session_wake" }) | null,
  ): Promise<void> {
    if (unwritten && this.staged?.has(wakeId)) return; // held already (the journal has it)
    this.statusSeen = null;
    const r = await this.ctx.host.startTurn(this.ctx.owner, text);
    if (unwritten) this.staged?.add(wakeId);
    this.ctx.append([
      ...(unwritten ? [unwritten] : []),
      r.ok
        ? {
            type: "message_delivery",
            wake_id: wakeId,
            owner: this.ctx.owner,
            delivered: true,
            turn_id: r.value.turnId,
            owner_status: ownerStatus,
          }
        : {
            type: "message_delivery",
            wake_id: wakeId,
            owner: this.ctx.owner,
            delivered: false,
            owner_status: ownerStatus,
            reason: `${r.reason}: ${r.message}`,
          },
    ]);
  }

  private message(ops: string[], wakeId: string): string {
    return [
      `session_step_waiting (${wakeId})`,
      `crw flow run ${this.ctx.runId} has ${ops.length} step(s) waiting for you: ${ops.join(", ")}.`,
      `Take them with: ${this.ctx.nextCommand}`,
    ].join("\n");
  }
}

/** `<call>/t<k>-a<n>` → the op `<call>/t<k>`. */
function opOfMarker(marker: string): string {
  return marker.replace(/-a\d+$/, "");
}
