import { randomUUID } from "node:crypto";
import type { ChildTurnExecutor } from "./childTurn.js";
import { ProcessContainment } from "./containment.js";
import { toError } from "./errors.js";
import { EventLoopSampler } from "./heartbeat.js";
import { HostRpcClient } from "./hostRpc.js";
import { LocalExecClient } from "./localExecClient.js";
import { ModelCatalog } from "./modelCatalog.js";
import { errorToRemote, type RemoteError } from "./protocol/envelope.js";
import { type InputFrame, type InputFrameOf, parseInputFrame } from "./protocol/index.js";
import type { OutputFrame } from "./protocol/output.js";
import type { AgentOptions } from "./protocol/sessionTurn.js";
import type { ProviderUsageReport } from "./providerUsage.js";
import { RetryPolicyMirror } from "./retryPolicy.js";
import { outsideDispatchedTurn, runInDispatchedTurn } from "./rpcTurn.js";
import { RunnerSessionTurns } from "./runnerSessionTurn.js";
import type { SessionTurnBackend } from "./sessionBackend.js";
import { SessionViews } from "./sessionViews.js";

/** The runner's side of the IPC channel: `process` in a real runner. */
export interface RunnerPort {
  send(frame: OutputFrame): boolean;
  onMessage(listener: (raw: unknown) => void): void;
  onDisconnect(listener: () => void): void;
  exit(code: number): void;
  log(level: "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>): void;
}

/**
 * Named fault points for crash and failure tests (env CRW_RUNNER_FAULT): the process misbehaves at exactly
 * that point, the way a broken build or a wedged machine would.
 */
export type RunnerFault =
  | "exit-before-hello"
  | "hang-before-hello"
  | "fail-boot"
  | "stall-tap"
  | "garbage-before-hello"
  /** Announce a build identity other than this file's (as a runner forked from a replaced build would). */
  | "other-build";

interface ActiveTurn {
  readonly sessionId: string;
  readonly controller: AbortController;
}

/**
 * One runner process: handshake (hello with its build identity, then boot), delegated turns under a
 * dispatched-turn context, reverse host calls, heartbeats, taps and publications. Frames that fail validation
 * are logged and never acted on.
 */
export class RunnerCore {
  readonly #turns = new Map<string, ActiveTurn>();
  readonly #views: SessionViews;
  readonly #hostRpc: HostRpcClient;
  readonly #sessionTurns: RunnerSessionTurns;
  readonly #containment = new ProcessContainment();
  readonly #localExec: LocalExecClient;
  #backend: Promise<SessionTurnBackend> | undefined;
  #mirror: RetryPolicyMirror | undefined;
  #agentOptions: AgentOptions | undefined;
  #catalog: ModelCatalog | undefined;
  #heartbeat: NodeJS.Timeout | undefined;
  #sampler: EventLoopSampler | undefined;
  #seq = 0;
  #stopping = false;

  constructor(
    private readonly port: RunnerPort,
    private readonly executor: ChildTurnExecutor,
    private readonly buildId: string,
    private readonly fault: RunnerFault | undefined,
    private readonly loadSessionBackend?: (
      options: AgentOptions | undefined,
      hooks: { readonly providerUsage?: ProviderUsageReport },
    ) => Promise<SessionTurnBackend>,
  ) {
    this.#views = new SessionViews((tapId, event) =>
      this.#send({ type: "tapEvent", requestId: randomUUID(), tapId, event }),
    );
    this.#sessionTurns = new RunnerSessionTurns(
      (frame) => this.#send(frame),
      (sessionId, event) => this.#views.event(sessionId, event),
    );
    this.#localExec = new LocalExecClient((frame) => this.#send(frame));
    this.#hostRpc = new HostRpcClient({
      send: (frame) => this.#send(frame),
      cancel: (frame) => this.#send(frame),
    });
  }

  start(): void {
    this.port.onMessage((raw) => this.#receive(raw));
    this.port.onDisconnect(() => this.#stop(0, "daemon channel disconnected"));
    if (this.fault === "exit-before-hello") {
      this.port.exit(3);
      return;
    }
    if (this.fault === "hang-before-hello") return;
    if (this.fault === "garbage-before-hello") {
      this.port.send({ type: "hello", requestId: "", buildId: this.buildId } as unknown as OutputFrame);
      this.port.send({
        type: "turnReply",
        requestId: "x",
        result: { ok: 1, error: 2 },
      } as unknown as OutputFrame);
    }
    this.#send({ type: "hello", requestId: randomUUID(), buildId: this.buildId, pid: process.pid });
  }

  #send(frame: OutputFrame): boolean {
    return this.port.send(frame);
  }

  #receive(raw: unknown): void {
    const parsed = parseInputFrame(raw);
    if (!parsed.ok) {
      this.port.log("warn", "refused invalid frame", { issues: parsed.issues });
      return;
    }
    try {
      this.#handle(parsed.frame);
    } catch (e) {
      this.port.log("error", "frame handler failed", { type: parsed.frame.type, error: toError(e).message });
    }
  }

  #handle(frame: InputFrame): void {
    if (frame.type !== "boot" && !this.#mirror) {
      // Nothing but boot is served before boot: a runner has no policy or catalog of its own.
      if (["hostRpcReply", "turnHostReply", "localExecEvent", "localExecResult"].includes(frame.type)) return;
      this.#replyError(frame, "RunnerNotBootedError", "not_booted", "runner has not booted");
      return;
    }
    switch (frame.type) {
      case "boot":
        this.#boot(frame);
        return;
      case "turn":
        return void this.#turn(frame);
      case "abort": {
        this.#turns.get(frame.turnId)?.controller.abort(frame.interruption);
        this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
        return;
      }
      case "release": {
        const state = this.#views.release(frame.sessionId);
        this.#send({ type: "releaseReply", requestId: frame.requestId, result: { ok: { state } } });
        return;
      }
      case "tap": {
        if (this.fault === "stall-tap") return;
        const snapshot = outsideDispatchedTurn(() =>
          this.#views.subscribe(frame.tapId, frame.sessionId, frame.history, { includeExecution: false }),
        );
        this.#send({ type: "tapReply", requestId: frame.requestId, result: { ok: snapshot } });
        return;
      }
      case "untap":
        this.#views.unsubscribe(frame.tapId);
        this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
        return;
      case "retryPolicyChanged":
        this.#mirror?.update(frame.retryPolicy);
        this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
        return;
      case "modelsChanged":
        this.#catalog?.publish(frame.catalog);
        this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
        return;
      case "hostRpcReply":
        this.#hostRpc.settle(frame.requestId, frame.result);
        return;
      case "localExecEvent":
        this.#localExec.event(frame.requestId, frame.event);
        return;
      case "localExecResult":
        this.#localExec.settle(frame.requestId, frame.result);
        return;
      case "turnHostReply":
        this.#sessionTurns.settle(frame.requestId, frame.result);
        return;
      case "sessionTurn":
        void this.#sessionTurn(frame);
        return;
      case "shutdown":
        this.#send({ type: "ack", requestId: frame.requestId, result: { ok: {} } });
        this.#stop(0, "shutdown requested");
        return;
    }
  }

  #boot(frame: InputFrameOf<"boot">): void {
    if (this.#mirror) {
      this.#replyError(frame, "RunnerBootError", "already_booted", "runner already booted");
      return;
    }
    if (frame.buildId !== this.buildId) {
      this.#send({
        type: "bootReply",
        requestId: frame.requestId,
        result: {
          error: { name: "RunnerStartupError", code: "build_mismatch", message: "runner build differs" },
        },
      });
      this.#stop(1, "build mismatch");
      return;
    }
    if (this.fault === "fail-boot") {
      this.#send({
        type: "bootReply",
        requestId: frame.requestId,
        result: {
          error: { name: "RunnerBootError", code: "boot_failed", message: "boot failed (fault point)" },
        },
      });
      this.#stop(1, "boot failed");
      return;
    }
    this.#mirror = new RetryPolicyMirror(frame.retryPolicy);
    this.#agentOptions = frame.agent;
    this.#catalog = new ModelCatalog(frame.catalog);
    this.#sampler = new EventLoopSampler();
    const heartbeat = setInterval(() => this.#beat(), frame.heartbeatIntervalMs);
    heartbeat.unref();
    this.#heartbeat = heartbeat;
    this.#send({
      type: "bootReply",
      requestId: frame.requestId,
      result: { ok: { buildId: this.buildId, policyRevision: frame.retryPolicy.revision } },
    });
  }

  async #turn(frame: InputFrameOf<"turn">): Promise<void> {
    const { turn } = frame;
    if (this.#turns.has(turn.turnId)) {
      return this.#replyError(
        frame,
        "DuplicateTurnError",
        "duplicate_turn",
        `turn ${turn.turnId} is already running`,
      );
    }
    // The lifetime is registered synchronously, before any await, so an abort frame always finds it.
    const controller = new AbortController();
    this.#turns.set(turn.turnId, { sessionId: turn.sessionId, controller });
    this.#views.beginTurn(turn);
    let text: string | undefined;
    try {
      this.#catalog?.forAccount(turn.accountId);
      const result = await runInDispatchedTurn(
        { turnId: turn.turnId, sessionId: turn.sessionId, signal: controller.signal },
        () =>
          this.executor.runTurn(turn, {
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
      this.#send({
        type: "turnReply",
        requestId: frame.requestId,
        result: { error: errorToRemote(toError(e)) },
      });
    } finally {
      this.#turns.delete(turn.turnId);
      this.#views.endTurn(turn.sessionId, text);
    }
  }

  async #sessionTurn(frame: InputFrameOf<"sessionTurn">): Promise<void> {
    const { turn } = frame;
    const reply = (
      result:
        | { ok: { stopReason: "stop" | "error" | "aborted"; errorMessage?: string } }
        | { error: RemoteError },
    ) => this.#send({ type: "sessionTurnReply", requestId: frame.requestId, result });
    if (this.#turns.has(turn.turnId)) {
      reply({
        error: {
          name: "DuplicateTurnError",
          code: "duplicate_turn",
          message: `turn ${turn.turnId} is already running`,
        },
      });
      return;
    }
    if (!this.loadSessionBackend) {
      reply({
        error: {
          name: "RunnerCapabilityError",
          code: "no_session_backend",
          message: "runner cannot run session turns",
        },
      });
      return;
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
      this.#backend ??= this.loadSessionBackend(this.#agentOptions, {
        providerUsage: (usage, at) =>
          void this.#send({ type: "providerUsage", requestId: randomUUID(), turnId: at.turnId, usage }),
      });
      const backend = await this.#backend;
      if (controller.signal.aborted) {
        reply({ ok: { stopReason: "aborted" } });
        return;
      }
      const outcome = await runInDispatchedTurn(
        { turnId: turn.turnId, sessionId, signal: controller.signal },
        () => this.#sessionTurns.run(turn, backend, controller.signal),
      );
      const { text: answer, ...settled } = outcome;
      text = answer;
      reply({ ok: settled });
    } catch (e) {
      reply({ error: errorToRemote(toError(e)) });
    } finally {
      this.#turns.delete(turn.turnId);
      this.#views.endTurn(sessionId, text);
    }
  }

  #beat(): void {
    this.#seq += 1;
    const containment = this.#containment.snapshot();
    this.#send({
      type: "heartbeat",
      requestId: randomUUID(),
      seq: this.#seq,
      eventLoopP99Ms: this.#sampler?.takeP99Ms() ?? 0,
      rssBytes: process.memoryUsage.rss(),
      turns: this.#turns.size,
      sessions: this.#views.sessionCount,
      ...(containment && { containment }),
    });
  }

  #replyError(frame: InputFrame, name: string, code: string, message: string): void {
    const result = { error: { name, code, message } };
    const requestId = frame.requestId;
    switch (frame.type) {
      case "boot":
        this.#send({ type: "bootReply", requestId, result });
        return;
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

  #stop(code: number, reason: string): void {
    if (this.#stopping) return;
    this.#stopping = true;
    this.port.log("info", "runner stopping", { reason });
    this.#hostRpc.close();
    this.#sessionTurns.close();
    this.#localExec.close();
    this.#containment.killAll();
    for (const t of this.#turns.values()) t.controller.abort({ origin: "shutdown" });
    this.#mirror?.dispose();
    this.#sampler?.stop();
    if (this.#heartbeat) clearInterval(this.#heartbeat);
    // Let queued IPC writes (the last replies) flush before the process goes.
    setImmediate(() => this.port.exit(code));
  }
}
