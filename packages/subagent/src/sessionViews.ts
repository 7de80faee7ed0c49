import type { DelegatedTurnRequest, HistoryEntry, TapEvent, TapSnapshot } from "./protocol/turn.js";
import { currentDispatchedTurn } from "./rpcTurn.js";

/** A snapshot asked to resolve a child's execution without the dispatched turn's authority. */
export class ExecutionAuthorityError extends Error {
  override readonly name = "ExecutionAuthorityError";
  readonly code = "no_execution_authority";
  readonly retryable = false;
}

/** Entries a runner keeps per session for views. */
export const HISTORY_WINDOW = 1_000;

interface SessionView {
  model: string | null;
  history: HistoryEntry[];
  /** Events of the turn in flight, replayed to a view that subscribes mid-turn. */
  live: TapEvent[];
  activeTurns: number;
  seq: number;
}

/**
 * What a runner knows about the child sessions it serves, for read-only views: model identity, history and
 * the live turn's events. Views (taps) subscribe per session; full events are forwarded only to them, so
 * nothing crosses IPC for a session nobody watches. A view never starts or borrows a turn.
 */
export class SessionViews {
  readonly #sessions = new Map<string, SessionView>();
  /** tapId -> sessionId */
  readonly #taps = new Map<string, string>();

  constructor(private readonly forward: (tapId: string, event: TapEvent) => void) {}

  get sessionCount(): number {
    return this.#sessions.size;
  }

  get tapCount(): number {
    return this.#taps.size;
  }

  isBusy(sessionId: string): boolean {
    return (this.#sessions.get(sessionId)?.activeTurns ?? 0) > 0;
  }

  beginTurn(request: DelegatedTurnRequest): void {
    const view = this.#view(request.sessionId);
    if (request.model) view.model = request.model;
    view.activeTurns += 1;
    view.live = [];
    this.#append(view, "user", request.prompt);
  }

  event(sessionId: string, event: TapEvent): void {
    const view = this.#sessions.get(sessionId);
    if (!view) return;
    view.live.push(event);
    for (const [tapId, tapped] of this.#taps) if (tapped === sessionId) this.forward(tapId, event);
  }

  endTurn(sessionId: string, text: string | undefined): void {
    const view = this.#sessions.get(sessionId);
    if (!view) return;
    view.activeTurns = Math.max(0, view.activeTurns - 1);
    for (const e of view.live)
      if (e.kind === "tool" && e.phase === "end") this.#append(view, "tool", e.result ?? "");
    if (text !== undefined) this.#append(view, "assistant", text);
    view.live = [];
  }

  /**
   * Subscribe a view and take its snapshot. Views call the snapshot seam with includeExecution: false by
   * default: a viewing request holds no dispatched-turn authority to resolve where the child executes.
   */
  subscribe(
    tapId: string,
    sessionId: string,
    history: { before?: string; limit: number },
    options: { includeExecution: boolean } = { includeExecution: false },
  ): TapSnapshot {
    const snapshot = this.snapshot(sessionId, history, options);
    this.#taps.set(tapId, sessionId);
    return snapshot;
  }

  /**
   * The snapshot seam: model identity, a history page and the live turn's events. With includeExecution it
   * also resolves the child's execution, which needs the authority of the dispatched turn running this very
   * session (the dispatched-turn context); without it that is refused, never guessed.
   */
  snapshot(
    sessionId: string,
    history: { before?: string; limit: number },
    options: { includeExecution: boolean },
  ): TapSnapshot {
    let execution: TapSnapshot["execution"];
    if (options.includeExecution) {
      const turn = currentDispatchedTurn();
      if (!turn || turn.sessionId !== sessionId) {
        throw new ExecutionAuthorityError(
          `no dispatched turn of session ${sessionId} here to resolve its execution`,
        );
      }
      execution = { turnId: turn.turnId };
    }
    const view = this.#sessions.get(sessionId);
    if (!view) return { sessionId, model: null, history: [], live: [], ...(execution && { execution }) };
    let end = view.history.length;
    if (history.before !== undefined) {
      const at = view.history.findIndex((h) => h.id === history.before);
      end = Math.max(at, 0);
    }
    return {
      sessionId,
      model: view.model,
      history: view.history.slice(Math.max(0, end - history.limit), end),
      live: [...view.live],
      ...(execution && { execution }),
    };
  }

  unsubscribe(tapId: string): boolean {
    return this.#taps.delete(tapId);
  }

  /** Forget an idle session; a busy one stays. */
  release(sessionId: string): "released" | "busy" {
    if (this.isBusy(sessionId)) return "busy";
    this.#sessions.delete(sessionId);
    return "released";
  }

  #view(sessionId: string): SessionView {
    let view = this.#sessions.get(sessionId);
    if (!view) {
      view = { model: null, history: [], live: [], activeTurns: 0, seq: 0 };
      this.#sessions.set(sessionId, view);
    }
    return view;
  }

  #append(view: SessionView, role: HistoryEntry["role"], text: string): void {
    view.seq += 1;
    view.history.push({ id: `h${view.seq}`, role, text });
    // A view's memory is bounded: the durable history is the journal, this is only its recent window.
    if (view.history.length > HISTORY_WINDOW) view.history.splice(0, view.history.length - HISTORY_WINDOW);
  }
}
