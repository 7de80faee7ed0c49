import type { z } from "zod";
import { HostProtocolError, HostRpcError, HostUnreachableError, toError } from "./errors.js";
import { toHostThread } from "./mapThread.js";
import { RolloutUnreadableError, readRolloutTokenCount } from "./rolloutTokens.js";
import { type RpcConnection as Rpc, RpcConnection, type RpcEvent } from "./rpcConnection.js";
import type {
  HostFailure,
  HostResult,
  HostThread,
  SessionHost,
  ThreadEventListener,
  TokenCount,
} from "./sessionHost.js";
import { startedThread, type ThreadOptions, threadResumeParams, threadStartParams } from "./threadOps.js";
import { hostTransportFromSpec } from "./transport/fromSpec.js";
import type { HostTransport } from "./transport/transport.js";
import {
  configWarningWire,
  type InitializeParams,
  type ThreadForkParams,
  type ThreadListParams,
  type ThreadReadParams,
  type ThreadResumeParams,
  type ThreadSourceKind,
  type TurnInterruptParams,
  type TurnStartParams,
  threadListResponseWire,
  threadReadResponseWire,
  threadStartResponseWire,
  turnStartResponseWire,
} from "./wire.js";

export interface AppServerHostOptions {
  /** A transport, or its spec string (`ws://…`, a command line, empty for `codex app-server proxy`). */
  transport: HostTransport | string;
  /** Bound on each request (default 10 s): a request never answered reads as `unreachable`. */
  requestTimeoutMs?: number;
  /** Bound on opening the transport and the initialize handshake (default 10 s). */
  connectTimeoutMs?: number;
  clientInfo?: { name: string; title: string; version: string };
  /** Typed events for the caller to log: notifications, refused server requests, reconnects, warnings. */
  onEvent?: (event: AppServerHostEvent) => void;
}

export type AppServerHostEvent =
  | RpcEvent
  | { type: "connected"; describe: string }
  | { type: "config_warning"; summary: string; details: string | null };

/** The subagent threads the owner's multi-agent tools spawn. */
export const subagentSourceKinds: ThreadSourceKind[] = ["subAgentThreadSpawn"];

const listPageLimit = 100;
const listPagesMax = 50;

/**
 * `SessionHost` over the Codex app-server protocol. The connection opens lazily, is shared by every call,
 * and is opened again by the next call after it died (an app-server restart): each answer is data, and a
 * host that cannot be asked answers `{ ok: false, reason: "unreachable" }` within the request bound.
 */
export interface AppServerHost extends SessionHost {
  /** For a caller that wants the raw protocol (tests, methods crw does not wrap). */
  request(method: string, params: unknown): Promise<HostResult<unknown>>;
  /** thread/start with the call's pair and environment entries (the app-server backend). */
  startThread(options: ThreadOptions): Promise<HostResult<HostThread>>;
  /** thread/resume (after an app-server restart) with the same entries again. */
  resumeThread(threadId: string, options?: ThreadOptions): Promise<HostResult<HostThread>>;
  /** thread/fork of a thread; the new thread has its own id (the host records `forkedFromId`). */
  forkThread(threadId: string, options?: ThreadOptions): Promise<HostResult<HostThread>>;
}

export function createAppServerHost(options: AppServerHostOptions): AppServerHost {
  const transport =
    typeof options.transport === "string" ? hostTransportFromSpec(options.transport) : options.transport;
  const requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
  const connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
  const emit = options.onEvent ?? (() => {});
  let connection: Promise<Rpc> | null = null;
  let closed = false;

  const threadListeners = new Set<ThreadEventListener>();
  const onRpcEvent = (event: RpcEvent) => {
    if (event.type === "notification" && threadListeners.size > 0) {
      const id = threadIdOf(event.notification.params);
      if (id) for (const l of [...threadListeners]) l(event.notification.method, id);
    }
    if (event.type === "notification" && event.notification.method === "configWarning") {
      const warning = configWarningWire.safeParse(event.notification.params);
      emit({
        type: "config_warning",
        summary: warning.success ? warning.data.summary : "configWarning",
        details: warning.success ? (warning.data.details ?? null) : null,
      });
    }
    emit(event);
  };

  async function open(): Promise<Rpc> {
    const rpc = await RpcConnection.open(transport, connectTimeoutMs, onRpcEvent);
    try {
      const params: InitializeParams = {
        clientInfo: options.clientInfo ?? { name: "crw", title: "crw flow", version: "0.1.0" },
        capabilities: { experimentalApi: true, requestAttestation: false },
      };
      await rpc.request("initialize", params, connectTimeoutMs);
      rpc.notify("initialized");
    } catch (e) {
      rpc.close();
      throw e;
    }
    emit({ type: "connected", describe: transport.describe });
    return rpc;
  }

  async function connected(): Promise<Rpc> {
    if (closed) throw new HostUnreachableError("closed", "the host adapter was closed");
    const current = connection;
    if (current) {
      const rpc = await current.catch(() => null);
      if (rpc?.isOpen) return rpc;
      if (connection === current) connection = null;
    }
    if (!connection) {
      const opening = open();
      connection = opening;
      opening.catch(() => {
        if (connection === opening) connection = null;
      });
    }
    return connection;
  }

  /**
   * One request. A read (`idempotent`) sent on a connection that then turns out dead (an app-server
   * restart leaves the old channel looking open until the first write) is sent once more on a new
   * connection; a write is never sent twice.
   */
  async function call(method: string, params: unknown, idempotent = false): Promise<unknown> {
    const rpc = await connected();
    try {
      return await rpc.request(method, params, requestTimeoutMs);
    } catch (e) {
      if (!idempotent || !(e instanceof HostUnreachableError) || e.code !== "closed") throw e;
      const fresh = await connected();
      return fresh.request(method, params, requestTimeoutMs);
    }
  }

  async function attempt<T>(run: () => Promise<T>): Promise<HostResult<T>> {
    try {
      return { ok: true, value: await run() };
    } catch (e) {
      return failureOf(e);
    }
  }

  function parse<S extends z.ZodType>(schema: S, value: unknown, method: string): z.output<S> {
    const parsed = schema.safeParse(value);
    if (!parsed.success) {
      throw new HostProtocolError(
        `${method}: the host's answer is not the protocol: ${parsed.error.message}`,
        method,
      );
    }
    return parsed.data;
  }

  async function readThreadRaw(threadId: string, includeTurns: boolean) {
    const params: ThreadReadParams = { threadId, includeTurns };
    try {
      return parse(threadReadResponseWire, await call("thread/read", params, true), "thread/read").thread;
    } catch (e) {
      // The pinned app-server cannot list the turns of a thread that has none on disk yet (a thread
      // started and never given a turn): "list_turns is not supported yet". It has no turns to list.
      if (!includeTurns || !(e instanceof HostRpcError) || !noTurnsYetPattern.test(e.message)) throw e;
      const bare = parse(
        threadReadResponseWire,
        await call("thread/read", { ...params, includeTurns: false }, true),
        "thread/read",
      );
      return { ...bare.thread, turns: [] };
    }
  }

  return {
    request: (method, params) => attempt(() => call(method, params)),

    startThread: (threadOptions) =>
      attempt(async () => {
        const answer = await call("thread/start", threadStartParams(threadOptions));
        return startedThread(parse(threadStartResponseWire, answer, "thread/start"));
      }),

    resumeThread: (threadId, threadOptions = {}) =>
      attempt(async () => {
        const answer = await call("thread/resume", threadResumeParams(threadId, threadOptions));
        return startedThread(parse(threadStartResponseWire, answer, "thread/resume"));
      }),

    forkThread: (threadId, threadOptions = {}) =>
      attempt(async () => {
        const start = threadStartParams(threadOptions);
        const params: ThreadForkParams = {
          threadId,
          excludeTurns: true,
          ...(start.cwd ? { cwd: start.cwd } : {}),
          ...(start.model ? { model: start.model } : {}),
          config: start.config ?? null,
        };
        const answer = await call("thread/fork", params);
        return startedThread(parse(threadStartResponseWire, answer, "thread/fork"));
      }),

    readThread: (threadId) => attempt(async () => toHostThread(await readThreadRaw(threadId, true))),

    readStatus: (threadId) => attempt(async () => toHostThread(await readThreadRaw(threadId, false)).status),

    onThreadEvent(listener) {
      threadListeners.add(listener);
      return () => threadListeners.delete(listener);
    },

    listSubagents: (ownerThreadId) =>
      attempt(async () => {
        const ids: string[] = [];
        let cursor: string | null = null;
        for (let page = 0; page < listPagesMax; page++) {
          const params: ThreadListParams = {
            sourceKinds: subagentSourceKinds,
            parentThreadId: ownerThreadId,
            limit: listPageLimit,
            cursor,
          };
          const answer = parse(
            threadListResponseWire,
            await call("thread/list", params, true),
            "thread/list",
          );
          for (const thread of answer.data) if (thread.parentThreadId === ownerThreadId) ids.push(thread.id);
          cursor = answer.nextCursor;
          if (!cursor) break;
        }
        const threads: HostThread[] = [];
        for (const id of ids) {
          try {
            threads.push(toHostThread(await readThreadRaw(id, true)));
          } catch (e) {
            // Listed, then gone (deleted or archived meanwhile): not the owner's subagent any more.
            if (failureOf(e).reason !== "unknown_thread") throw e;
          }
        }
        return threads;
      }),

    async readTokenCount(thread: HostThread): Promise<HostResult<TokenCount | undefined>> {
      if (!thread.rolloutPath) {
        return {
          ok: false,
          reason: "rollout_unreadable",
          message: `thread ${thread.id}: the host names no rollout file`,
        };
      }
      try {
        return { ok: true, value: await readRolloutTokenCount(thread.rolloutPath) };
      } catch (e) {
        return failureOf(e);
      }
    },

    /**
     * Makes sure the turn runs no more: ok when the host interrupted it, and also when it runs nothing
     * (the pinned server answers "no active turn to interrupt" for a turn that ended, and "thread not
     * found" for a thread it has not loaded, e.g. after a restart: a thread/read then tells a thread at
     * rest from one the host does not know).
     */
    interruptTurn: (threadId, turnId) =>
      attempt(async () => {
        const params: TurnInterruptParams = { threadId, turnId };
        try {
          await call("turn/interrupt", params);
        } catch (e) {
          if (!(e instanceof HostRpcError)) throw e;
          if (noActiveTurnPattern.test(e.message)) return;
          if (!unknownThreadPattern.test(e.message)) throw e;
          const thread = await readThreadRaw(threadId, false);
          if (thread.status.type === "active") throw e;
        }
      }),

    startTurn: (threadId, text) =>
      attempt(async () => {
        const thread = await readThreadRaw(threadId, false);
        if (thread.status.type === "notLoaded") {
          const resume: ThreadResumeParams = { threadId, excludeTurns: true };
          await call("thread/resume", resume);
        }
        const params: TurnStartParams = { threadId, input: [{ type: "text", text, text_elements: [] }] };
        const answer = parse(turnStartResponseWire, await call("turn/start", params), "turn/start");
        return { turnId: answer.turn.id };
      }),

    async close() {
      closed = true;
      threadListeners.clear();
      const current = connection;
      connection = null;
      const rpc = await current?.catch(() => null);
      rpc?.close();
    },
  };
}

/** The thread a notification names: `threadId` in its params, or the thread it carries (thread/started). */
function threadIdOf(params: unknown): string | null {
  if (!params || typeof params !== "object") return null;
  const p = params as { threadId?: unknown; thread?: { id?: unknown } };
  if (typeof p.threadId === "string") return p.threadId;
  return typeof p.thread?.id === "string" ? p.thread.id : null;
}

const noTurnsYetPattern = /list_turns is not supported/i;
const noActiveTurnPattern = /no active turn/i;

/** Unknown-thread answers of the pinned app-server (`thread not loaded: <id>`, `invalid thread id: …`). */
const unknownThreadPattern = /thread not (loaded|found)|invalid thread id|no (such )?thread|unknown thread/i;

export function failureOf(e: unknown): HostFailure {
  const error = toError(e);
  if (error instanceof HostUnreachableError)
    return { ok: false, reason: "unreachable", message: error.message };
  if (error instanceof HostRpcError) {
    const reason = unknownThreadPattern.test(error.message) ? "unknown_thread" : "protocol";
    return { ok: false, reason, message: `${error.method}: ${error.message}` };
  }
  if (error instanceof RolloutUnreadableError) {
    return { ok: false, reason: "rollout_unreadable", message: error.message };
  }
  if (error instanceof HostProtocolError) {
    return { ok: false, reason: "protocol", message: error.message };
  }
  return { ok: false, reason: "protocol", message: error.message };
}
