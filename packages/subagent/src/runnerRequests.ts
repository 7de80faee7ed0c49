import { randomUUID } from "node:crypto";
import type { ChildTurnExecutor } from "./childTurn.js";
import { ProcessContainment } from "./containment.js";
import { toError } from "./errors.js";
import { HostRpcClient } from "./hostRpc.js";
import { LocalExecClient } from "./localExecClient.js";
import type { ModelCatalog } from "./modelCatalog.js";
import { errorToRemote, type RemoteError } from "./protocol/envelope.js";
import { type InputFrame, type InputFrameOf, parseInputFrame } from "./protocol/index.js";
import type { OutputFrame } from "./protocol/output.js";
import type { AgentOptions, TurnRecord } from "./protocol/sessionTurn.js";
import type { RetryPolicyMirror } from "./retryPolicyMirror.js";
import { outsideDispatchedTurn, runInDispatchedTurn } from "./rpcTurn.js";
import type { RunnerFault, RunnerPort, SessionBackendLoader } from "./runnerCore.js";
import { RunnerSessionTurns } from "./runnerSessionTurn.js";
import type { SessionTurnBackend } from "./sessionBackend.js";
import { SessionViews } from "./sessionViews.js";

/** What the boot frame gave the runner. */
export interface RunnerBoot {
  readonly mirror: RetryPolicyMirror;
  readonly catalog: ModelCatalog;
  readonly agentOptions: AgentOptions | undefined;
}

export interface RunnerRequestsDeps {
  readonly port: RunnerPort;
  readonly executor: ChildTurnExecutor;
  readonly loadSessionBackend: SessionBackendLoader | undefined;
  readonly fault: RunnerFault | undefined;
  /** Undefined until the runner accepted its boot frame. */
  readonly booted: () => RunnerBoot | undefined;
  readonly stop: (code: number, reason: string) => void;
}

interface ActiveTurn {
  readonly sessionId: string;
  readonly controller: AbortController;
}

/**
 * Every frame but boot (which RunnerCore reads itself): delegated turns under a dispatched-turn context,
 * session turns, taps, reverse host calls, local execution, policy and catalog publications, shutdown. It is
 * the runner's turn-time code, imported once the runner is ready (or once a frame needs it), so the frame
 * schemas and everything a turn runs stay off the boot path. Frames that fail validation are logged and
 * never acted on.
 */
export class RunnerRequests {
  readonly #turns = new Map<string, ActiveTurn>();
  readonly #views: SessionViews;
  readonly #hostRpc: HostRpcClient;
  readonly #sessionTurns: RunnerSessionTurns;
  readonly #containment = new ProcessContainment();
  readonly #localExec: LocalExecClient;
  #backend: Promise<SessionTurnBackend> | undefined;

  constructor(private readonly deps: RunnerRequestsDeps) {
    const send = (frame: OutputFrame) => deps.port.send(frame);
    this.#views = new SessionViews((tapId, event) =>
      send({ type: "tapEvent", requestId: randomUUID(), tapId, event }),
    );
    this.#sessionTurns = new RunnerSessionTurns(send, (sessionId, event) =>
      this.#views.event(sessionId, event),
    );
    this.#localExec = new LocalExecClient(send);
    this.#hostRpc = new HostRpcClient({ send, cancel: send });
  }

  /**
   * Loads the session backend before the first session turn asks for it, once the runner is booted: a pool's
   * runners are there to run session turns, and a burst of first turns (a boot recovery's) would otherwise
   * wait for the agent loop's imports to compile while the daemon and the other runners want the same cores.
   * A load that fails here fails the first session turn, as it would have failed there.
   */
  warmSessionBackend(): void {
    const boot = this.deps.booted();
    const load = this.deps.loadSessionBackend;
    if (!boot || !load) return;
    this.#sessionBackend(load, boot).catch(() => {});
  }

  #sessionBackend(load: SessionBackendLoader, boot: RunnerBoot): Promise<SessionTurnBackend> {
    this.#backend ??= load(boot.agentOptions, {
      providerUsage: (usage, at) =>
        void this.#send({ type: "providerUsage", requestId: randomUUID(), turnId: at.turnId, usage }),
    });
    return this.#backend;
  }

  /** What a heartbeat reports of the work in this runner. */
  load(): { turns: number; sessions: number; containment?: { revision: number; killTokens: string[] } } {
    const containment = this.#containment.snapshot();
    return {
      turns: this.#turns.size,
      sessions: this.#views.sessionCount,
      ...(containment && { containment }),
    };
  }

  receive(raw: unknown): void {
    const parsed = parseInputFrame(raw);
    if (!parsed.ok) {
      this.deps.port.log("warn", "refused invalid frame", { issues: parsed.issues });
      return;
    }
    try {
      this.#handle(parsed.frame);
    } catch (e) {
      this.deps.port.log("error", "frame handler failed", {
        type: parsed.frame.type,
        error: toError(e).message,
      });
    }
  }

  /** The channel is gone: pending calls fail, contained processes and running turns end. */
  close(): void {
    this.#hostRpc.close();
    this.#sessionTurns.close();
    this.#localExec.close();
    this.#containment.killAll();
    for (const t of this.#turns.values()) t.controller.abort({ origin: "shutdown" });
  }

  #send(frame: OutputFrame): boolean {
    return this.deps.port.send(frame);
  }

  #ack(frame: InputFrame): void {
    this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
  }

  #handle(frame: InputFrame): void {
    // RunnerCore reads boot frames before anything reaches here.
    if (frame.type === "boot") return;
    const boot = this.deps.booted();
    if (!boot) {
      // Nothing but boot is served before boot: a runner has no policy or catalog of its own.
      if (["hostRpcReply", "turnHostReply", "localExecEvent", "localExecResult"].includes(frame.type)) return;
      this.#replyError(frame, {
        error: { name: "RunnerNotBootedError", code: "not_booted", message: "runner has not booted" },
      });
      return;
    }
    switch (frame.type) {
      case "turn":
        void this.#turn(frame, boot);
        break;
      case "sessionTurn":
        void this.#sessionTurn(frame, boot);
        break;
      case "abort":
        this.#turns.get(frame.turnId)?.controller.abort(frame.interruption);
        this.#ack(frame);
        break;
      case "release": {
        const state = this.#views.release(frame.sessionId);
        this.#send({ type: "releaseReply", requestId: frame.requestId, result: { ok: { state } } });
        break;
      }
      case "tap":
        this.#tap(frame);
        break;
      case "untap":
        this.#views.unsubscribe(frame.tapId);
        this.#ack(frame);
        break;
      case "retryPolicyChanged":
        boot.mirror.update(frame.retryPolicy);
        this.#ack(frame);
        break;
      case "modelsChanged":
        boot.catalog.publish(frame.catalog);
        this.#ack(frame);
        break;
      case "hostRpcReply":
        this.#hostRpc.settle(frame.requestId, frame.result);
        break;
      case "localExecEvent":
        this.#localExec.event(frame.requestId, frame.event);
        break;
      case "localExecResult":
        this.#localExec.settle(frame.requestId, frame.result);
        break;
      case "turnHostReply":
        this.#sessionTurns.settle(frame.requestId, frame.result);
        break;
      case "shutdown":
        this.#ack(frame);
        this.deps.stop(0, "shutdown requested");
        break;
    }
  }

  #tap(frame: InputFrameOf<"tap">): void {
    if (this.deps.fault === "stall-tap") return;
    const snapshot = outsideDispatchedTurn(() =>
      this.#views.subscribe(frame.tapId, frame.sessionId, frame.history, { includeExecution: false }),
    );
    this.#send({ type: "tapReply", requestId: frame.requestId, result: { ok: snapshot } });
  }

  async #turn(frame: InputFrameOf<"turn">, boot: RunnerBoot): Promise<void> {
    const { turn } = frame;
    if (this.#turns.has(turn.turnId)) return this.#replyError(frame, duplicateTurn(turn.turnId));
    // The lifetime is registered synchronously, before any await, so an abort frame always finds it.
    const controller = new AbortController();
    this.#turns.set(turn.turnId, { sessionId: turn.sessionId, controller });
    this.#views.beginTurn(turn);
    let text: string | undefined;
    try {
      boot.catalog.forAccount(turn.accountId);
      const result = await runInDispatchedTurn(
        { turnId: turn.turnId, sessionId: turn.sessionId, signal: controller.signal },
        () =>
          this.deps.executor.runTurn(turn, {
            signal: controller.signal,
            emit: (event) => this.#views.event(turn.sessionId, event),
            progress: (text) =>
              this.#send({
                type: "progress",
                requestId: randomUUID(),
                turnId: turn.turnId,
                text: text.slice(0, 512),
              }),
            hostRpc: (method, params) => this.#hostRpc.call(method, params as never),
            spawn: (command) => this.#containment.start(command),
            localExec: (request, onEvent) => this.#localExec.call(request, onEvent),
            stopServices: () => this.#localExec.stopServices(),
          }),
      );
      text = result.text;
      this.#send({ type: "turnReply", requestId: frame.requestId, result: { ok: result } });
    } catch (e) {
      this.#replyError(frame, { error: errorToRemote(toError(e)) });
    } finally {
      this.#turns.delete(turn.turnId);
      this.#views.endTurn(turn.sessionId, text);
    }
  }

  async #sessionTurn(frame: InputFrameOf<"sessionTurn">, boot: RunnerBoot): Promise<void> {
    const { turn } = frame;
    const reply = (
      result:
        | { ok: { stopReason: "stop" | "error" | "aborted"; errorMessage?: string } }
        | { error: RemoteError },
      record?: TurnRecord,
    ): void =>
      void this.#send({
        type: "sessionTurnReply",
        requestId: frame.requestId,
        result,
        ...(record !== undefined && { record }),
      });
    if (this.#turns.has(turn.turnId)) return reply(duplicateTurn(turn.turnId));
    const load = this.deps.loadSessionBackend;
    if (!load) {
      return reply({
        error: {
          name: "RunnerCapabilityError",
          code: "no_session_backend",
          message: "runner cannot run session turns",
        },
      });
    }
    // Registered synchronously, before the backend loads, so an abort frame always finds the turn.
    const controller = new AbortController();
    const sessionId = turn.request.sessionId;
    this.#turns.set(turn.turnId, { sessionId, controller });
    const lastUser = [...turn.request.context].reverse().find((m) => m.role === "user");
    this.#views.beginTurn({
      turnId: turn.turnId,
      channelId: turn.channelId,
      sessionId,
      model: turn.request.model,
      prompt: lastUser?.role === "user" ? lastUser.content : "",
    });
    let text: string | undefined;
    try {
      const backend = await this.#sessionBackend(load, boot);
      if (controller.signal.aborted) return reply({ ok: { stopReason: "aborted" } });
      const outcome = await runInDispatchedTurn(
        { turnId: turn.turnId, sessionId, signal: controller.signal },
        () => this.#sessionTurns.run(turn, backend, controller.signal),
      );
      const { text: answer, record, ...settled } = outcome;
      text = answer;
      reply({ ok: settled }, record);
    } catch (e) {
      reply({ error: errorToRemote(toError(e)) });
    } finally {
      this.#turns.delete(turn.turnId);
      this.#views.endTurn(sessionId, text);
    }
  }

  /** A refusal in the frame's own reply type; a request without one is answered by `ack`. */
  #replyError(frame: InputFrame, result: { error: RemoteError }): void {
    const requestId = frame.requestId;
    switch (frame.type) {
      case "turn":
        this.#send({ type: "turnReply", requestId, result });
        return;
      case "release":
        this.#send({ type: "releaseReply", requestId, result });
        return;
      case "tap":
        this.#send({ type: "tapReply", requestId, result });
        return;
      default:
        this.#send({ type: "ack", requestId, result });
    }
  }
}

function duplicateTurn(turnId: string): { error: RemoteError } {
  return {
    error: {
      name: "DuplicateTurnError",
      code: "duplicate_turn",
      message: `turn ${turnId} is already running`,
    },
  };
}
