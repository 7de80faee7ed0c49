import type {
  AssistantMessage,
  DelegationRepository,
  JournalDelta,
  JournalWrite,
  SessionRow,
  ToolCallContent,
  ToolResultMessage,
  TranscriptMessage,
} from "@crw/db";
import type { DelegatedExecutionScope, DelegatedTurnIdentity } from "../scope/index.js";
import { CapturedWrites, pausedError } from "./checkpoint.js";
import { faultPoint } from "./faults.js";
import { KeyedMutex } from "./notifier.js";
import { type MutatingTool, scopedTools } from "./scopedTools.js";
import { SessionContexts } from "./sessionContexts.js";
import {
  type ProgressSink,
  type RecordMeta,
  type SessionTurnRunner,
  type TurnHost,
  type TurnOutcome,
  type TurnPurpose,
  turnErrorData,
} from "./turn.js";

export interface SessionTurnInput {
  readonly session: SessionRow;
  /** Journaled at the start of the turn, in the turn's lock (the task, a steer, delivered results). */
  readonly input: readonly JournalWrite[];
  readonly tools: readonly MutatingTool[];
  readonly scope: DelegatedExecutionScope | null;
  readonly readOnly: boolean;
  readonly systemPrompt: string;
  /**
   * Set when `systemPrompt` is not stored yet: the turn's first journal write stores it (first writer
   * wins) and this is told the prompt stored then.
   */
  readonly promptStored?: (stored: string) => void;
  readonly progress: ProgressSink;
  /** After each tool round: journals and returns what arrived meanwhile (results, steers), FIFO. */
  readonly drainSteering: () => Promise<TranscriptMessage[]>;
  readonly signal?: AbortSignal;
  readonly identity: DelegatedTurnIdentity;
  /** A host-minted purpose, passed to the runner as `TurnRequest.purpose` (absent for ordinary turns). */
  readonly purpose?: TurnPurpose;
  /**
   * The session's whole journal as the caller just read or wrote it (a fresh child's start): with no input
   * of its own, the turn folds it instead of reading the journal.
   */
  readonly journal?: JournalDelta;
}

type Appender = (entries: readonly JournalWrite[]) => Promise<unknown>;

/**
 * Runs one turn of one session at a time, journaling through `TurnHost`: each assistant message and tool
 * result is durable before the runner goes on, and each tool call's intent is durable before the tool runs.
 * `isStreaming` tells result delivery whether the session will drain its queue at the next tool round.
 */
export class SessionTurns {
  readonly #lock = new KeyedMutex();
  readonly #streaming = new Set<string>();
  /** Each turn reads only the journal rows after those this process already folded. */
  readonly #contexts: SessionContexts;

  /**
   * Every journal write of a turn goes through `writes`: a session's writes commit in the order the runner
   * reported them, and the restart checkpoint drains them (and refuses new ones).
   */
  readonly writes: CapturedWrites;

  constructor(
    private readonly repo: DelegationRepository,
    private readonly runner: SessionTurnRunner,
    writes?: CapturedWrites,
  ) {
    this.writes = writes ?? new CapturedWrites();
    this.#contexts = new SessionContexts(repo);
  }

  isStreaming(sessionId: string): boolean {
    return this.#streaming.has(sessionId);
  }

  /** Whether a turn runs or waits to run for this session in this process. */
  isBusy(sessionId: string): boolean {
    return this.#lock.busy(sessionId);
  }

  exclusive<T>(sessionId: string, fn: () => Promise<T>): Promise<T> {
    return this.#lock.run(sessionId, fn);
  }

  /** Call inside `exclusive` for the session. */
  async runLocked(turn: SessionTurnInput): Promise<TurnOutcome> {
    const { session } = turn;
    const principal = session.principalAccountId;
    if (this.writes.closed) throw pausedError("a new turn");
    const append = this.#appender(turn);
    if (turn.input.length > 0)
      await this.writes.capture("a turn's input", () => append(turn.input), session.id);
    const context =
      turn.journal && turn.input.length === 0
        ? this.#contexts.adopt(session.id, turn.journal)
        : await this.#contexts.contextOf(session.id, principal);
    const host: TurnHost = {
      record: (message, meta) =>
        this.writes.capture(
          "a journal write",
          () => this.#record(session, message, append, meta),
          session.id,
        ),
      beforeToolCall: (call: ToolCallContent) =>
        this.writes.capture("a tool intent", () => this.#intent(call, append), session.id),
      drainSteering: () => this.writes.capture("a steering drain", turn.drainSteering, session.id),
      progress: turn.progress,
    };
    this.#streaming.add(session.id);
    try {
      return await this.runner.runTurn(
        {
          sessionId: session.id,
          principalAccountId: principal,
          model: session.model,
          systemPrompt: turn.systemPrompt,
          context,
          tools: scopedTools(turn.tools, turn.scope, turn.readOnly),
          scope: turn.scope,
          readOnly: turn.readOnly,
          workDir: turn.scope?.workDir ?? null,
          identity: turn.identity,
          ...(session.kind === "root" ? { rootSession: true as const } : {}),
          parentSessionId: session.parentSessionId,
          ...(turn.purpose ? { purpose: turn.purpose } : {}),
          signal: turn.signal ?? new AbortController().signal,
        },
        host,
      );
    } catch (e) {
      // A runner that throws (e.g. one that could not start) broke off the turn; the turn still ends as
      // data, and the error's name and code travel with it instead of being flattened into prose.
      const error = turnErrorData(e);
      return { stopReason: "error", errorMessage: error.message, error };
    } finally {
      this.#streaming.delete(session.id);
    }
  }

  /**
   * The turn's journal append: while its system prompt is not stored, each append stores it with its rows
   * (the first to commit does; the prompt never needs a statement of its own).
   */
  #appender(turn: SessionTurnInput): (entries: readonly JournalWrite[]) => Promise<unknown> {
    const { session } = turn;
    let unstored = turn.promptStored ? turn.systemPrompt : null;
    return async (entries) => {
      if (unstored === null) return this.repo.append(session.id, session.principalAccountId, entries);
      const out = await this.repo.appendWithSystemPrompt(
        session.id,
        session.principalAccountId,
        entries,
        unstored,
      );
      if (out.systemPrompt !== null) {
        unstored = null;
        turn.promptStored?.(out.systemPrompt);
      }
      return out.entries;
    };
  }

  async #intent(call: ToolCallContent, append: Appender): Promise<void> {
    await append([
      {
        body: {
          type: "tool_intent",
          toolCallId: call.id,
          toolName: call.name,
          arguments: call.arguments,
        },
      },
    ]);
    faultPoint("tool.after_intent", call.name);
  }

  async #record(
    session: SessionRow,
    message: AssistantMessage | ToolResultMessage,
    append: Appender,
    meta?: RecordMeta,
  ): Promise<void> {
    const principal = session.principalAccountId;
    const resultId = message.role === "toolResult" ? message.details?.resultId : undefined;
    if (!resultId) {
      // Usage goes beside an assistant row (its own column); any other row has none to keep.
      const usage = message.role === "assistant" ? meta?.usage : undefined;
      await append([{ body: { type: "message", message }, ...(usage ? { usage } : {}) }]);
      return;
    }
    // A foreground Delegate's result: the toolResult is its delivery, appended and acknowledged together.
    const out = await this.repo.deliverResults(session.id, principal, [resultId], () => message);
    if (out.delivered.length === 0) {
      const { details: _delivered, ...plain } = message as ToolResultMessage;
      await append([
        {
          body: {
            type: "message",
            message: { ...plain, content: `${plain.content}\n(already delivered earlier)` },
          },
        },
      ]);
    }
  }
}
