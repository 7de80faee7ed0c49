import type { SubagentRun } from "@crw/db";
import { toError } from "./errors.js";
import type { ProgressEvent, ProgressSink } from "./turn.js";

/**
 * What a delegation's owning job publishes about its call while it works: an immutable snapshot, taken when
 * the event arrives (never when an asynchronous publication later runs), numbered in the order taken.
 */
export interface RunProgressSnapshot {
  readonly runId: string;
  readonly childSessionId: string;
  /** 1, 2, …: the order the snapshots were taken; publication follows it. */
  readonly seq: number;
  readonly mode: "foreground" | "background";
  readonly toolCalls: number;
  readonly lastTool: string | null;
  readonly textChars: number;
  readonly compactions: number;
}

/** The host's asynchronous publication contract (by default: the run row's progress columns). */
export type ProgressPublisher = (snapshot: RunProgressSnapshot) => Promise<void>;

/** A progress snapshot could not be published. Diagnostic only: the call's own outcome is unchanged. */
export class ProgressPublicationError extends Error {
  override readonly name = "ProgressPublicationError";
  readonly code = "progress_publication_failed";
  constructor(
    readonly runId: string,
    readonly seq: number,
    cause: unknown,
  ) {
    super(`progress ${seq} of run ${runId} was not published: ${toError(cause).message}`, { cause });
  }
}

/**
 * How a job paces its publications. `intervalMs`: a publication starts no sooner than this after the job
 * began or after the one before it started (a child streaming text makes an event per delta: without a pace
 * each would be a write of its own); meanwhile the newest snapshot waits. `foldable`: the snapshot still
 * waiting when the call settles is not published on its own but handed to the settlement, which writes it
 * with the result (a call shorter than the interval publishes nothing apart).
 */
export interface ProgressPace {
  readonly intervalMs: number;
  readonly foldable: boolean;
}

/** Every snapshot published at once, as taken (a host's own publication contract). */
const UNPACED: ProgressPace = { intervalMs: 0, foldable: false };

interface Slot {
  snapshot: RunProgressSnapshot;
  done: Promise<void>;
  /** Taken by the settlement instead of published. */
  folded: boolean;
  /** Starts the publication now rather than at its paced time. */
  hurry: () => void;
}

/**
 * The progress of one delegation or continuation, owned by the job that runs it. Each event updates the
 * job's state and takes a frozen snapshot; snapshots are published one at a time, in order, through the
 * host's asynchronous contract, paced (`ProgressPace`). While a publication is in flight or not yet due
 * only the newest waiting snapshot is kept (an older one would be overwritten by it anyway). `drain()`
 * settles every publication taken so far, so a call's progress never outlives the call: the job drains
 * before its result is settled (`drainForSettlement`, which may hand the last snapshot to the settlement).
 */
export class RunProgressJob {
  readonly #publish: ProgressPublisher;
  readonly #onFailure: (error: ProgressPublicationError) => void;
  readonly #base: { runId: string; childSessionId: string };
  #mode: "foreground" | "background";
  #seq = 0;
  #toolCalls = 0;
  #lastTool: string | null = null;
  #textChars = 0;
  #compactions = 0;
  #tail: Promise<void> = Promise.resolve();
  #waiting: Slot | undefined;
  #closed = false;
  readonly #pace: ProgressPace;
  /** When the last publication started (the job's start before the first). */
  #lastStart = Date.now();
  readonly failures: ProgressPublicationError[] = [];

  constructor(
    run: Pick<SubagentRun, "id" | "childSessionId" | "mode">,
    publish: ProgressPublisher,
    onFailure: (error: ProgressPublicationError) => void = () => {},
    pace: ProgressPace = UNPACED,
  ) {
    this.#publish = publish;
    this.#onFailure = onFailure;
    this.#pace = pace;
    this.#base = { runId: run.id, childSessionId: run.childSessionId ?? "" };
    this.#mode = run.mode;
  }

  /** The sink the call's turns report to. Identity (`session`) events are not progress. */
  readonly sink: ProgressSink = (event: ProgressEvent) => {
    if (event.type === "session" || this.#closed) return;
    if (event.type === "tool") {
      this.#toolCalls++;
      this.#lastTool = event.toolName;
    } else if (event.type === "text") {
      this.#textChars += event.text.length;
    } else {
      this.#compactions++;
    }
    void this.#enqueue(this.#snapshot()).catch(() => {});
  };

  get mode(): "foreground" | "background" {
    return this.#mode;
  }

  /**
   * Ctrl+B's snapshot: the call is now a background call. Resolves once that snapshot is published; rejects
   * with the publication failure (the caller keeps its foreground waiter attached).
   */
  background(): Promise<void> {
    this.#mode = "background";
    return this.#enqueue(this.#snapshot(), true);
  }

  /** Settles every publication taken so far (failures are recorded, never thrown); later events are ignored. */
  async drain(): Promise<void> {
    this.#closed = true;
    this.#waiting?.hurry();
    await this.#tail;
  }

  /**
   * `drain()` before the call's result is settled. With a foldable pace the snapshot not yet published is
   * returned instead, for the settlement to write with the result; a publication already running is waited
   * for first, so what the settlement writes is the newest.
   */
  async drainForSettlement(): Promise<RunProgressSnapshot | undefined> {
    const waiting = this.#waiting;
    // Once drained (the restart checkpoint), what waited is being published: the settlement takes nothing.
    if (!this.#pace.foldable || waiting === undefined || this.#closed) {
      await this.drain();
      return undefined;
    }
    this.#closed = true;
    waiting.folded = true;
    waiting.hurry();
    await this.#tail;
    return waiting.snapshot;
  }

  /**
   * A snapshot the settlement took and could not write (its settlement was refused or failed while the call
   * stays open): published after all, as its turn would have been.
   */
  async publishUnsettled(snapshot: RunProgressSnapshot): Promise<void> {
    await this.#tail;
    await this.#publishOne(snapshot).catch(() => {});
  }

  async #publishOne(snapshot: RunProgressSnapshot): Promise<void> {
    try {
      await this.#publish(snapshot);
    } catch (e) {
      const error = new ProgressPublicationError(snapshot.runId, snapshot.seq, e);
      this.failures.push(error);
      this.#onFailure(error);
      throw error;
    }
  }

  #snapshot(): RunProgressSnapshot {
    return Object.freeze({
      ...this.#base,
      seq: ++this.#seq,
      mode: this.#mode,
      toolCalls: this.#toolCalls,
      lastTool: this.#lastTool,
      textChars: this.#textChars,
      compactions: this.#compactions,
    });
  }

  #enqueue(snapshot: RunProgressSnapshot, exact = false): Promise<void> {
    const waiting = this.#waiting;
    if (waiting && !exact) {
      // Not yet started: the newer snapshot replaces it in the same slot (its waiters see the newer write).
      waiting.snapshot = snapshot;
      return waiting.done;
    }
    // An exact snapshot (Ctrl+B's) is published at once, and takes the place of one still waiting (it is
    // newer and counts the same).
    if (waiting) {
      waiting.folded = true;
      waiting.hurry();
    }
    let timer: NodeJS.Timeout | undefined;
    let hurried = false;
    let due: () => void = () => {};
    const paced = new Promise<void>((resolve) => {
      due = resolve;
    });
    const slot: Slot = {
      snapshot,
      done: Promise.resolve(),
      folded: false,
      hurry: () => {
        hurried = true;
        clearTimeout(timer);
        due();
      },
    };
    const wait = async () => {
      const delay = exact || hurried ? 0 : this.#lastStart + this.#pace.intervalMs - Date.now();
      if (delay <= 0) return;
      timer = setTimeout(due, delay);
      // A waiting publication does not hold a process open; the call's own work does.
      timer.unref?.();
      await paced;
    };
    const run = async () => {
      if (this.#waiting === slot) this.#waiting = undefined;
      if (slot.folded) return;
      this.#lastStart = Date.now();
      await this.#publishOne(slot.snapshot);
    };
    slot.done = this.#tail.then(wait).then(run);
    this.#waiting = exact ? undefined : slot;
    this.#tail = slot.done.catch(() => {});
    return slot.done;
  }
}
