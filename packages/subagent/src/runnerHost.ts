import type { ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import type { TurnHost, TurnOutcome, TurnRequest } from "@crw/brain";
import {
  DelegationAbortedError,
  LocalExecSessionClosedError,
  RemoteTurnError,
  RunnerExitedError,
  SESSION_CLOSED,
  TapTimeoutError,
  toError,
} from "./errors.js";
import { measureProcessTree, type TreeMemory } from "./heartbeat.js";
import { errorToRemote, type RemoteError } from "./protocol/envelope.js";
import { hostRpcParamsSchemas } from "./protocol/hostRpcMethods.js";
import { type OutputFrame, type OutputFrameOf, parseOutputFrame } from "./protocol/index.js";
import type { InputFrame } from "./protocol/input.js";
import type { HeartbeatFrame, ReleaseState } from "./protocol/output.js";
import type { ModelCatalogPublication, RetryPolicy } from "./protocol/policy.js";
import type { TurnHostCall } from "./protocol/sessionTurn.js";
import {
  type DelegatedTurnRequest,
  type DelegatedTurnResult,
  type TapEvent,
  tapCursorSchema,
} from "./protocol/turn.js";

import {
  MEASURE_FAILED_TEXT,
  type RunnerStats,
  type SessionTurnMeta,
  type SubagentRunnerHostDeps,
  TAP_TIMEOUT_MS,
  type TapHandle,
} from "./runnerHostTypes.js";
import { startRunnerHost } from "./runnerStartup.js";
import { TurnRecords } from "./turnRecords.js";

export * from "./runnerHostTypes.js";

type ReplyType = "bootReply" | "turnReply" | "releaseReply" | "tapReply" | "ack" | "sessionTurnReply";
interface Pending {
  readonly reply: ReplyType;
  readonly resolve: (frame: OutputFrame) => void;
  readonly reject: (error: Error) => void;
}
interface ActiveTurn {
  readonly sessionId: string;
  readonly onProgress?: (text: string) => void;
  readonly rpcs: Set<AbortController>;
  /** Set for a delegation-core session turn: the daemon-side seam its records and turnHost calls reach. */
  readonly session?: {
    readonly request: TurnRequest;
    readonly host: TurnHost;
    readonly records: TurnRecords;
  };
  /** The turn's end is known here (its reply came, or its runner is gone): a call still waiting is refused. */
  ended?: boolean;
}

/**
 * One runner process, seen from the daemon. `start` is one physical fork + handshake attempt: it resolves
 * with a ready host or rejects with a RunnerStartupError naming the category. A ready host relays requests
 * as typed frames; when the process exits every pending request is rejected at once (a pending release
 * resolves "released") and nothing is replayed.
 */
export class SubagentRunnerHost {
  readonly #pending = new Map<string, Pending>();
  readonly #turns = new Map<string, ActiveTurn>();
  readonly #rpcs = new Map<string, AbortController>();
  readonly #taps = new Map<string, (event: TapEvent) => void>();
  /**
   * Admitted background services: after process-started their controller moves here from the turn's RPC
   * set, so the turn's end no longer cancels them. The only state a service adds: one controller each.
   */
  readonly #serviceStreams = new Map<string, { controller: AbortController; turnId: string }>();
  /** Every local execution call still open, by call id (turn-bound or retained). */
  readonly #localCalls = new Map<string, { controller: AbortController; turnId: string }>();
  #state: "ready" | "exited" = "ready";
  #heartbeat: { frame: HeartbeatFrame; memory: TreeMemory } | undefined;
  #containment: { revision: number; killTokens: readonly string[] } | undefined;
  #sentPolicyRevision: number;
  #unsubscribePolicy: () => void;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private constructor(
    private readonly deps: SubagentRunnerHostDeps,
    private readonly child: ChildProcess,
    sentPolicy: RetryPolicy,
    unsubscribePolicy: () => void,
    exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>,
    private readonly bootRevision: number,
  ) {
    this.#sentPolicyRevision = sentPolicy.revision;
    this.#unsubscribePolicy = unsubscribePolicy;
    this.exited = exited;
  }

  get runnerId(): string {
    return this.deps.runnerId;
  }
  get pid(): number | undefined {
    return this.child.pid;
  }
  get isReady(): boolean {
    return this.#state === "ready";
  }
  get activeTurns(): number {
    return this.#turns.size;
  }
  /** Whether a reverse host-call handler is attached (DelegatedTurnRunner.supportsHostRpc). */
  supportsHostRpc(): boolean {
    return this.deps.hostRpc !== undefined;
  }
  /** The policy revision the runner confirmed at boot. */
  get bootPolicyRevision(): number {
    return this.bootRevision;
  }
  /** Newest containment state; daemon-private, for runner-death cleanup only. */
  get containment(): { revision: number; killTokens: readonly string[] } | undefined {
    return this.#containment;
  }

  stats(): RunnerStats {
    const hb = this.#heartbeat;
    return {
      runnerId: this.deps.runnerId,
      pid: this.child.pid,
      state: this.#state,
      activeTurns: this.#turns.size,
      ...(hb && {
        load: {
          eventLoopP99Ms: hb.frame.eventLoopP99Ms,
          rssBytes: hb.frame.rssBytes,
          turns: hb.frame.turns,
          sessions: hb.frame.sessions,
          memory: hb.memory,
        },
      }),
    };
  }

  static start(deps: SubagentRunnerHostDeps): Promise<SubagentRunnerHost> {
    return startRunnerHost(deps, (child, policy, unsubscribe, exited, bootRevision) => {
      const host = new SubagentRunnerHost(deps, child, policy, unsubscribe, exited, bootRevision);
      host.#attach();
      return host;
    });
  }

  #attach(): void {
    this.child.on("message", (raw) => this.#receive(raw));
    this.exited.then((exit) => this.#onExit(exit));
  }

  /** A later policy revision reaches the runner as retryPolicyChanged; older ones never do. */
  policyChanged(policy: RetryPolicy): void {
    if (this.#state !== "ready" || policy.revision <= this.#sentPolicyRevision) return;
    this.#sentPolicyRevision = policy.revision;
    this.#request({ type: "retryPolicyChanged", requestId: randomUUID(), retryPolicy: policy }, "ack").catch(
      () => {},
    );
  }

  async runTurn(
    request: DelegatedTurnRequest,
    options: { signal?: AbortSignal; onProgress?: (text: string) => void } = {},
  ): Promise<DelegatedTurnResult> {
    if (options.signal?.aborted) throw new DelegationAbortedError(request.channelId);
    const turn: ActiveTurn = {
      sessionId: request.sessionId,
      onProgress: options.onProgress,
      rpcs: new Set(),
    };
    this.#turns.set(request.turnId, turn);
    const onAbort = () => {
      this.#request(
        { type: "abort", requestId: randomUUID(), turnId: request.turnId, interruption: { origin: "stop" } },
        "ack",
      ).catch(() => {});
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const reply = (await this.#request(
        { type: "turn", requestId: randomUUID(), turn: request },
        "turnReply",
      )) as OutputFrameOf<"turnReply">;
      if ("error" in reply.result) throw remoteTurnError(reply.result.error);
      return reply.result.ok;
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      this.#turns.delete(request.turnId);
      // Reverse calls are turn-bound: a finished turn retires their authority.
      for (const c of turn.rpcs) c.abort();
    }
  }

  /**
   * Run a delegation-core session turn in this runner. The model loop runs there; journal writes, tool
   * intents, steering drains and host tools run here, through `turnHost`, in the order the seam states.
   */
  async runSessionTurn(
    request: TurnRequest,
    turnHost: TurnHost,
    meta: SessionTurnMeta,
    signal?: AbortSignal,
  ): Promise<TurnOutcome> {
    const records = new TurnRecords(turnHost);
    const turn: ActiveTurn = {
      sessionId: request.sessionId,
      rpcs: new Set(),
      session: { request, host: turnHost, records },
    };
    this.#turns.set(meta.turnId, turn);
    const onAbort = () => {
      this.#request(
        { type: "abort", requestId: randomUUID(), turnId: meta.turnId, interruption: { origin: "stop" } },
        "ack",
      ).catch(() => {});
    };
    const signals = [request.signal, signal].filter((s): s is AbortSignal => s !== undefined);
    for (const s of signals) s.addEventListener("abort", onAbort, { once: true });
    try {
      if (signals.some((s) => s.aborted)) return { stopReason: "aborted" };
      const reply = (await this.#request(
        {
          type: "sessionTurn",
          requestId: randomUUID(),
          turn: {
            turnId: meta.turnId,
            channelId: meta.channelId,
            ...(meta.parentSessionId !== undefined && { parentSessionId: meta.parentSessionId }),
            runner: meta.runner,
            request: {
              sessionId: request.sessionId,
              principalAccountId: request.principalAccountId,
              model: request.model,
              systemPrompt: request.systemPrompt,
              context: [...request.context],
              tools: request.tools.map((t) => ({
                name: t.name,
                description: t.description,
                parameters: { ...t.parameters },
              })),
              scope: request.scope,
              readOnly: request.readOnly,
              workDir: request.workDir,
            },
          },
        },
        "sessionTurnReply",
      ).finally(() => {
        turn.ended = true;
      })) as OutputFrameOf<"sessionTurnReply">;
      if (reply.record !== undefined) records.add(reply.record);
      const failed = await records.written();
      if ("error" in reply.result) throw remoteTurnError(reply.result.error);
      if (failed !== undefined) return { stopReason: "error", errorMessage: failed.message };
      const { stopReason, errorMessage } = reply.result.ok;
      return { stopReason, ...(errorMessage !== undefined && { errorMessage }) };
    } finally {
      turn.ended = true;
      // Whatever the turn's end, the records its runner sent are written before it is reported.
      await records.written();
      for (const s of signals) s.removeEventListener("abort", onAbort);
      this.#turns.delete(meta.turnId);
      for (const c of turn.rpcs) c.abort();
    }
  }

  /** Ask the runner to forget an idle session. Waits without a deadline: the answer or the exit ends it. */
  async release(sessionId: string): Promise<ReleaseState> {
    if (this.#state !== "ready" || !this.child.connected) return "released";
    try {
      const reply = (await this.#request(
        { type: "release", requestId: randomUUID(), sessionId },
        "releaseReply",
      )) as OutputFrameOf<"releaseReply">;
      return "error" in reply.result ? "failed" : reply.result.ok.state;
    } catch (e) {
      if (e instanceof RunnerExitedError) return "released";
      throw e;
    }
  }

  /**
   * A live read-only view of a child: the snapshot, then its events while subscribed. Starts no turn.
   * Fails with "sub-agent runner tap timed out" when the runner does not answer within two seconds.
   */
  async tap(
    sessionId: string,
    onEvent: (event: TapEvent) => void,
    history: { before?: string; limit?: number } = {},
  ): Promise<TapHandle> {
    if (history.before !== undefined) tapCursorSchema.parse(history.before);
    const tapId = randomUUID();
    this.#taps.set(tapId, onEvent);
    const requestId = randomUUID();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TapTimeoutError()), TAP_TIMEOUT_MS);
    });
    try {
      const reply = (await Promise.race([
        this.#request(
          {
            type: "tap",
            requestId,
            tapId,
            sessionId,
            history: {
              limit: history.limit ?? 50,
              ...(history.before !== undefined && { before: history.before }),
            },
          },
          "tapReply",
        ),
        timeout,
      ])) as OutputFrameOf<"tapReply">;
      if ("error" in reply.result) throw remoteTurnError(reply.result.error);
      return { snapshot: reply.result.ok, close: () => this.#untap(tapId) };
    } catch (e) {
      this.#pending.delete(requestId);
      await this.#untap(tapId);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  async #untap(tapId: string): Promise<void> {
    if (!this.#taps.delete(tapId) || this.#state !== "ready") return;
    await this.#request({ type: "untap", requestId: randomUUID(), tapId }, "ack").catch(() => {});
  }

  /** Admitted live background services (their retained controllers). */
  get serviceStreamCount(): number {
    return this.#serviceStreams.size;
  }

  get tapCount(): number {
    return this.#taps.size;
  }

  async publishCatalog(catalog: ModelCatalogPublication): Promise<void> {
    await this.#request({ type: "modelsChanged", requestId: randomUUID(), catalog }, "ack");
  }

  /** Ask the runner to stop; kills it if it has not exited within the grace period. */
  async shutdown(graceMs = 5_000): Promise<void> {
    if (this.#state === "exited") return;
    this.#request({ type: "shutdown", requestId: randomUUID() }, "ack").catch(() => {});
    const timer = setTimeout(() => this.kill(), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  kill(): void {
    if (this.#state === "ready") this.child.kill("SIGKILL");
  }

  #request(frame: InputFrame, reply: ReplyType): Promise<OutputFrame> {
    return new Promise((resolve, reject) => {
      if (this.#state !== "ready" || !this.child.connected) {
        return reject(
          new RunnerExitedError(this.deps.runnerId, {
            code: this.child.exitCode,
            signal: this.child.signalCode,
          }),
        );
      }
      this.#pending.set(frame.requestId, { reply, resolve, reject });
      this.child.send(frame, (err) => {
        if (err && this.#pending.delete(frame.requestId)) {
          reject(
            new RunnerExitedError(this.deps.runnerId, {
              code: this.child.exitCode,
              signal: this.child.signalCode,
            }),
          );
        }
      });
    });
  }

  #post(frame: InputFrame): void {
    if (this.#state === "ready" && this.child.connected) this.child.send(frame, () => {});
  }

  #refuse(issues: string): void {
    this.deps.onEvent?.({ type: "frame_refused", runnerId: this.deps.runnerId, issues });
  }

  #receive(raw: unknown): void {
    const parsed = parseOutputFrame(raw);
    if (!parsed.ok) {
      this.#refuse(parsed.issues);
      return;
    }
    const frame = parsed.frame;
    switch (frame.type) {
      case "bootReply":
      case "turnReply":
      case "releaseReply":
      case "tapReply":
      case "sessionTurnReply":
      case "ack": {
        const pending = this.#pending.get(frame.requestId);
        if (!pending) {
          this.#refuse(`${frame.type} for unknown request`);
          return;
        }
        if (pending.reply !== frame.type) {
          this.#refuse(`${frame.type} answers a request expecting ${pending.reply}`);
          return;
        }
        this.#pending.delete(frame.requestId);
        pending.resolve(frame);
        return;
      }
      case "hello":
        this.#refuse("hello after handshake");
        return;
      case "heartbeat":
        return void this.#onHeartbeat(frame);
      case "progress":
        this.#turns.get(frame.turnId)?.onProgress?.(frame.text);
        return;
      case "tapEvent":
        this.#taps.get(frame.tapId)?.(frame.event);
        return;
      case "hostRpc":
        this.#onHostRpc(frame);
        return;
      case "turnHost":
        this.#onTurnHost(frame);
        return;
      case "turnRecord":
        // A record of a turn that has ended here (stopped, or its runner's reply came first) has no turn to
        // be written for: the turn's outcome is already reported.
        this.#turns.get(frame.turnId)?.session?.records.add(frame.record);
        return;
      case "turnProgress": {
        const session = this.#turns.get(frame.turnId)?.session;
        session?.host.progress(frame.event);
        return;
      }
      case "localExec":
        this.#onLocalExec(frame);
        return;
      case "localExecCancel": {
        // hostCancel: the original call and turn ids must both match.
        const call = this.#localCalls.get(frame.callId);
        if (call && call.turnId === frame.turnId) call.controller.abort();
        return;
      }
      case "hostRpcCancel":
        this.#rpcs.get(frame.rpcId)?.abort();
        return;
      case "providerUsage": {
        // Counted only for a session turn this host dispatched and that is still running.
        const turn = this.#turns.get(frame.turnId);
        if (!turn?.session) return;
        this.deps.onEvent?.({
          type: "provider_usage",
          runnerId: this.runnerId,
          sessionId: turn.sessionId,
          turnId: frame.turnId,
          usage: frame.usage,
        });
        return;
      }
    }
  }

  async #onHeartbeat(frame: HeartbeatFrame): Promise<void> {
    if (frame.containment && frame.containment.revision > (this.#containment?.revision ?? -1)) {
      this.#containment = frame.containment;
    }
    let memory: TreeMemory;
    try {
      const tree = await measureProcessTree(this.child.pid ?? -1, this.deps.procRoot);
      memory = { ...tree, complete: true };
    } catch (e) {
      this.deps.onEvent?.({
        type: "measure_failed",
        runnerId: this.deps.runnerId,
        message: MEASURE_FAILED_TEXT,
        error: toError(e).message,
      });
      memory = { rssBytes: frame.rssBytes, processes: 1, complete: false };
    }
    const { containment: _private, ...load } = frame;
    this.#heartbeat = { frame: load, memory };
    // Kill tokens stay in this host: events carry the load only.
    this.deps.onEvent?.({ type: "heartbeat", runnerId: this.deps.runnerId, heartbeat: load, memory });
  }

  #onLocalExec(frame: OutputFrameOf<"localExec">): void {
    const callId = frame.requestId;
    const fail = (code: string, message: string) =>
      this.#post({
        type: "localExecResult",
        requestId: callId,
        result: { error: { name: "HostRpcRefusedError", code, message } },
      });
    const turn = this.#turns.get(frame.turnId);
    // New starts and stdin need an active admitted turn.
    if (!turn) {
      fail("outside_turn", "local execution outside a dispatched turn");
      return;
    }
    const handler = this.deps.localExec;
    if (!handler) {
      fail("unsupported", "no local execution on this daemon");
      return;
    }
    const controller = new AbortController();
    turn.rpcs.add(controller);
    this.#localCalls.set(callId, { controller, turnId: frame.turnId });
    const request = frame.request;
    handler(request, {
      runnerId: this.deps.runnerId,
      turnId: frame.turnId,
      sessionId: turn.sessionId,
      signal: controller.signal,
      emit: (event) => {
        if (controller.signal.aborted && !this.#serviceStreams.has(callId)) return;
        if (event.kind === "process-started" && request.op === "start" && request.service) {
          turn.rpcs.delete(controller);
          this.#serviceStreams.set(callId, { controller, turnId: frame.turnId });
        }
        this.#post({ type: "localExecEvent", requestId: callId, event });
      },
    })
      .then(
        (ok) => this.#post({ type: "localExecResult", requestId: callId, result: { ok } }),
        (e) =>
          this.#post({
            type: "localExecResult",
            requestId: callId,
            result: { error: errorToRemote(toError(e)) },
          }),
      )
      .finally(() => {
        // The final exit or error removes the call, retained or not.
        turn.rpcs.delete(controller);
        this.#serviceStreams.delete(callId);
        this.#localCalls.delete(callId);
      });
  }

  /** A runner's call into the seam's TurnHost (or a host tool) for one of its session turns. */
  #onTurnHost(frame: OutputFrameOf<"turnHost">): void {
    const reply = (result: { ok: unknown } | { error: RemoteError }) =>
      this.#post({ type: "turnHostReply", requestId: frame.requestId, result });
    const turn = this.#turns.get(frame.turnId);
    const session = turn?.session;
    if (!turn || !session) {
      reply({ error: OUTSIDE_TURN });
      return;
    }
    void session.records.written().then(async (failed) => {
      if (failed !== undefined) return reply({ error: errorToRemote(failed) });
      // Waited behind a record while the turn ended (its runner exited): nothing of it runs any more.
      if (turn.ended) return reply({ error: OUTSIDE_TURN });
      try {
        reply({ ok: (await this.#runTurnHostCall(turn, session, frame.call)) ?? null });
      } catch (e) {
        reply({ error: errorToRemote(toError(e)) });
      }
    });
  }

  async #runTurnHostCall(
    turn: ActiveTurn,
    session: NonNullable<ActiveTurn["session"]>,
    call: TurnHostCall,
  ): Promise<unknown> {
    switch (call.op) {
      case "beforeToolCall":
        return session.host.beforeToolCall(call.call);
      case "drainSteering": {
        const messages = await session.host.drainSteering();
        // Steering the runner's turn consumed is settled once the daemon's seam answered with it.
        if (messages.length > 0)
          this.deps.onEvent?.({
            type: "steer_settled",
            runnerId: this.runnerId,
            sessionId: session.request.sessionId,
            count: messages.length,
          });
        return messages;
      }
      case "executeTool": {
        const tool = session.request.tools.find((t) => t.name === call.toolName);
        if (!tool) throw Object.assign(new Error(`no host tool ${call.toolName}`), { code: "unknown_tool" });
        const controller = new AbortController();
        const onAbort = () => controller.abort();
        session.request.signal.addEventListener("abort", onAbort, { once: true });
        turn.rpcs.add(controller);
        try {
          return await tool.execute(call.args, {
            sessionId: session.request.sessionId,
            principalAccountId: session.request.principalAccountId,
            toolCallId: call.toolCallId,
            readOnly: session.request.readOnly,
            workDir: session.request.workDir,
            signal: controller.signal,
            progress: (event) => session.host.progress(event),
          });
        } finally {
          session.request.signal.removeEventListener("abort", onAbort);
          turn.rpcs.delete(controller);
        }
      }
    }
  }

  #onHostRpc(frame: OutputFrameOf<"hostRpc">): void {
    const reply = (result: { ok: unknown } | { error: RemoteError }) =>
      this.#post({ type: "hostRpcReply", requestId: frame.requestId, result });
    const turn = this.#turns.get(frame.turnId);
    if (!turn) {
      reply({
        error: {
          name: "HostRpcRefusedError",
          code: "outside_turn",
          message: `${frame.method} outside a dispatched turn`,
        },
      });
      return;
    }
    const handler = this.deps.hostRpc;
    if (!handler) {
      reply({
        error: { name: "HostRpcRefusedError", code: "unsupported", message: "no host call handler" },
      });
      return;
    }
    const params = hostRpcParamsSchemas[frame.method].safeParse(frame.params);
    if (!params.success) {
      reply({
        error: {
          name: "HostRpcRefusedError",
          code: "invalid_params",
          message: `${frame.method}: invalid params`,
        },
      });
      return;
    }
    const controller = new AbortController();
    turn.rpcs.add(controller);
    this.#rpcs.set(frame.requestId, controller);
    handler(frame.method, params.data, {
      runnerId: this.deps.runnerId,
      turnId: frame.turnId,
      sessionId: turn.sessionId,
      signal: controller.signal,
    })
      .then(
        (ok) => reply({ ok: ok ?? null }),
        (e) => reply({ error: errorToRemote(toError(e)) }),
      )
      .finally(() => {
        turn.rpcs.delete(controller);
        this.#rpcs.delete(frame.requestId);
      });
  }

  #onExit(exit: { code: number | null; signal: NodeJS.Signals | null }): void {
    this.#state = "exited";
    this.#unsubscribePolicy();
    const error = new RunnerExitedError(this.deps.runnerId, exit);
    for (const [id, p] of [...this.#pending]) {
      this.#pending.delete(id);
      if (p.reply === "releaseReply")
        p.resolve({ type: "releaseReply", requestId: id, result: { ok: { state: "released" } } });
      else p.reject(error);
    }
    for (const c of this.#rpcs.values()) c.abort();
    this.#rpcs.clear();
    // Runner exit aborts every retained service stream, reporting the transport loss as session.closed;
    // no service is replayed.
    const closed = new LocalExecSessionClosedError(
      `${SESSION_CLOSED}: sub-agent runner ${this.deps.runnerId} exited`,
    );
    for (const s of this.#serviceStreams.values()) s.controller.abort(closed);
    for (const c of this.#localCalls.values()) c.controller.abort(closed);
    this.#serviceStreams.clear();
    this.#localCalls.clear();
    this.#taps.clear();
    this.deps.onEvent?.({ type: "exit", runnerId: this.deps.runnerId, ...exit });
  }
}

function remoteTurnError(remote: RemoteError): Error {
  if (remote.name === "DelegationAbortedError") return new DelegationAbortedError("", remote.message);
  return new RemoteTurnError(remote);
}

/** The answer to a runner's call for a session turn that is not (or no longer) running here. */
const OUTSIDE_TURN: RemoteError = {
  name: "HostRpcRefusedError",
  code: "outside_turn",
  message: "turn host call outside a session turn",
};
