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
 * The progress of one delegation or continuation, owned by the job that runs it. Each event updates the
 * job's state and takes a frozen snapshot; snapshots are published one at a time, in order, through the
 * host's asynchronous contract. While a publication is in flight only the newest waiting snapshot is kept
 * (an older one would be overwritten by it anyway). `drain()` settles every publication taken so far, so a
 * call's progress never outlives the call: the job drains before its result is settled.
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
  #waiting: { snapshot: RunProgressSnapshot; done: Promise<void> } | undefined;
  #closed = false;
  readonly failures: ProgressPublicationError[] = [];

  constructor(
    run: Pick<SubagentRun, "id" | "childSessionId" | "mode">,
    publish: ProgressPublisher,
    onFailure: (error: ProgressPublicationError) => void = () => {},
  ) {
    this.#publish = publish;
    this.#onFailure = onFailure;
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
    await this.#tail;
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
    const slot: { snapshot: RunProgressSnapshot; done: Promise<void> } = {
      snapshot,
      done: Promise.resolve(),
    };
    const run = async () => {
      if (this.#waiting === slot) this.#waiting = undefined;
      try {
        await this.#publish(slot.snapshot);
      } catch (e) {
        const error = new ProgressPublicationError(slot.snapshot.runId, slot.snapshot.seq, e);
        this.failures.push(error);
        this.#onFailure(error);
        throw error;
      }
    };
    slot.done = this.#tail.then(run);
    this.#waiting = exact ? undefined : slot;
    this.#tail = slot.done.catch(() => {});
    return slot.done;
  }
}
