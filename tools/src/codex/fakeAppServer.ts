import { mkdtempSync, rmSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type WebSocket, WebSocketServer } from "ws";
import { FakeHostError, FakeHostState, type SpawnInput, type TurnEnd } from "./fakeHostState.js";
import type { FakeUsage, Phase, ThreadStatus } from "./fakeShapes.js";

/**
 * A fake Codex app-server: the real JSON-RPC protocol (no "jsonrpc" member, initialize + initialized,
 * the thread/turn methods crw uses) over ws:// on 127.0.0.1, holding threads in the generated types'
 * shapes and writing a rollout per thread. A test scripts it in process (owner threads, spawns, turns
 * that complete, fail or never end, thread statuses) and makes it unreachable or unresponsive.
 * `stdioProxyCommand(url)` gives the same server as a command speaking stdio, like `codex app-server proxy`.
 */

export interface ReceivedRequest {
  method: string;
  params: unknown;
}

interface Client {
  socket: WebSocket;
  /** Answered initialize. */
  initializing: boolean;
  /** Sent `initialized`: receives notifications from now on. */
  initialized: boolean;
}

export interface FakeAppServerOptions {
  /** CODEX_HOME-like directory for rollouts; a temporary one (removed on stop) by default. */
  home?: string;
  port?: number;
}

export class FakeAppServer {
  readonly state: FakeHostState;
  readonly requests: ReceivedRequest[] = [];
  readonly notifications: Array<{ method: string; params: unknown }> = [];
  private server: WebSocketServer | null = null;
  private readonly clients = new Set<Client>();
  private port = 0;
  private interruptDelayMs = 0;
  private readonly ownHome: boolean;
  /** Methods whose requests are taken and never answered ("*" for all). */
  private unanswered = new Set<string>();
  /** Answers given instead of the real ones (a host that speaks something else). */
  private readonly overrides = new Map<string, unknown>();
  private turnStartHandlers: Array<(threadId: string, turnId: string, text: string) => void> = [];

  private constructor(
    readonly home: string,
    ownHome: boolean,
  ) {
    this.ownHome = ownHome;
    this.state = new FakeHostState(home, (method, params) => this.broadcast(method, params));
  }

  static async start(options: FakeAppServerOptions = {}): Promise<FakeAppServer> {
    const home = options.home ?? mkdtempSync(join(tmpdir(), "crw-fake-codex-"));
    const fake = new FakeAppServer(home, options.home === undefined);
    await fake.listen(options.port ?? 0);
    return fake;
  }

  get url(): string {
    return `ws://127.0.0.1:${this.port}`;
  }

  /** A command line (for `hostTransportFromSpec`) that bridges stdio to this server. */
  stdioProxyCommand(): string {
    const script = new URL("./stdioProxy.mjs", import.meta.url).pathname;
    return `${JSON.stringify(process.execPath)} ${JSON.stringify(script)} ${this.url}`;
  }

  // ---- the script ----------------------------------------------------------------------------------

  createOwnerThread(init: { cwd?: string; model?: string } = {}): string {
    return this.state.createThread({ cwd: init.cwd ?? this.home, model: init.model ?? "mock-model" });
  }

  /** An owner turn in progress (the owner at work), which collects its collabAgentToolCall items. */
  startOwnerTurn(ownerThreadId: string, text = "run the workflow"): string {
    return this.state.startTurn(ownerThreadId, text);
  }

  spawnSubagent(input: SpawnInput): { threadId: string; turnId: string } {
    return this.state.spawnSubagent(input);
  }

  /** send_input: a new turn on the subagent (recorded as a sendInput call on its owner's turn). */
  sendInput(threadId: string, message: string): string {
    const parent = this.state.get(threadId).thread.parentThreadId;
    if (parent) {
      this.state.recordCollab(parent, undefined, {
        tool: "sendInput",
        senderThreadId: parent,
        receiverThreadIds: [threadId],
        prompt: message,
        model: null,
        reasoningEffort: null,
      });
    }
    return this.state.startTurn(threadId, message);
  }

  completeTurn(threadId: string, end: TurnEnd = {}): void {
    this.state.completeTurn(threadId, end);
  }

  /** Shorthand: the turn ends with one final_answer message. */
  answer(threadId: string, text: string, usage?: FakeUsage, phase: Phase = "final_answer"): void {
    this.state.completeTurn(threadId, { messages: [{ text, phase }], usage });
  }

  /** The turn ends with the host's error; a null `codexErrorInfo` is an error the host names no kind of. */
  failTurn(
    threadId: string,
    codexErrorInfo: string | null,
    options: { turnId?: string; message?: string; ended?: "failed" | "interrupted" } = {},
  ): void {
    this.state.failTurn(threadId, { codexErrorInfo, ...options });
  }

  interruptTurn(threadId: string, turnId?: string): void {
    this.state.interruptTurn(threadId, turnId);
  }

  setThreadStatus(threadId: string, status: ThreadStatus["type"]): void {
    this.state.setStatus(
      threadId,
      status === "active" ? { type: "active", activeFlags: [] } : ({ type: status } as ThreadStatus),
    );
  }

  /** close_agent: the subagent's thread reads notLoaded from now on. */
  closeAgent(threadId: string): void {
    const parent = this.state.get(threadId).thread.parentThreadId;
    if (parent) {
      this.state.recordCollab(parent, undefined, {
        tool: "closeAgent",
        senderThreadId: parent,
        receiverThreadIds: [threadId],
        prompt: null,
        model: null,
        reasoningEffort: null,
      });
    }
    this.state.setStatus(threadId, { type: "notLoaded" });
  }

  /**
   * As the real server, an interrupt is answered at once and the turn ends later: after `ms` the turn is
   * interrupted and its thread goes idle (0, the default, ends it before the answer).
   */
  setInterruptDelay(ms: number): void {
    this.interruptDelayMs = ms;
  }

  /** Each turn/interrupt that took effect: when its turn ended (epoch ms). */
  readonly interruptsEnded: Array<{ threadId: string; turnId: string; at: number }> = [];

  private interrupt(threadId: string, turnId: string): Record<string, never> {
    if (this.state.get(threadId).thread.status.type === "notLoaded")
      throw new FakeHostError(-32600, `thread not found: ${threadId}`);
    const turn = this.state.turn(threadId, turnId || undefined);
    if (turn.status !== "inProgress") throw new FakeHostError(-32600, "no active turn to interrupt");
    const end = () => {
      // a turn the test ended meanwhile, or a thread it unloaded, stays as it is
      if (turn.status !== "inProgress" || this.state.get(threadId).thread.status.type === "notLoaded") return;
      this.state.interruptTurn(threadId, turn.id);
      this.interruptsEnded.push({ threadId, turnId: turn.id, at: Date.now() });
    };
    if (this.interruptDelayMs > 0) setTimeout(end, this.interruptDelayMs);
    else end();
    return {};
  }

  /** Called for every request as it is received, before it is handled (to see the disk at that moment). */
  onRequest(handler: (method: string, params: unknown) => void): void {
    this.requestHandlers.push(handler);
  }

  private readonly requestHandlers: Array<(method: string, params: unknown) => void> = [];

  /** Called for every turn a client starts with turn/start (after the answer is sent). */
  onTurnStart(handler: (threadId: string, turnId: string, text: string) => void): void {
    this.turnStartHandlers.push(handler);
  }

  /** Requests of these methods (or "*") are received and never answered; `[]` answers again. */
  setUnresponsive(methods: string[] | "*"): void {
    this.unanswered = new Set(methods === "*" ? ["*"] : methods);
  }

  /** Answers every request of `method` with `result` as it is (undefined restores the real answer). */
  overrideAnswer(method: string, result: unknown): void {
    if (result === undefined) this.overrides.delete(method);
    else this.overrides.set(method, result);
  }

  /** Sends a notification to every initialized client (e.g. `configWarning`). */
  notify(method: string, params: unknown): void {
    this.broadcast(method, params);
  }

  /** Drops every connection and stops listening: connecting is refused until `setReachable()`. */
  async setUnreachable(): Promise<void> {
    for (const client of this.clients) client.socket.terminate();
    this.clients.clear();
    const server = this.server;
    this.server = null;
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  }

  async setReachable(): Promise<void> {
    if (!this.server) await this.listen(this.port);
  }

  /** An app-server restart: connections drop and every thread reads notLoaded until resumed. */
  async restart(): Promise<void> {
    await this.setUnreachable();
    for (const id of this.state.threads.keys()) this.state.setStatus(id, { type: "notLoaded" });
    await this.setReachable();
  }

  async stop(): Promise<void> {
    await this.setUnreachable();
    if (this.ownHome) rmSync(this.home, { recursive: true, force: true });
  }

  // ---- the protocol --------------------------------------------------------------------------------

  private async listen(port: number): Promise<void> {
    const server = new WebSocketServer({ host: "127.0.0.1", port, perMessageDeflate: false });
    await new Promise<void>((resolve, reject) => {
      server.once("listening", () => resolve());
      server.once("error", reject);
    });
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
    server.on("connection", (socket) => {
      const client: Client = { socket, initializing: false, initialized: false };
      this.clients.add(client);
      socket.on("close", () => this.clients.delete(client));
      socket.on("message", (data) => {
        for (const line of data.toString().split("\n")) if (line.trim()) this.receive(client, line);
      });
    });
  }

  private broadcast(method: string, params: unknown): void {
    this.notifications.push({ method, params });
    const text = JSON.stringify({ method, params, emittedAtMs: Date.now() });
    for (const client of this.clients) if (client.initialized) client.socket.send(text);
  }

  private receive(client: Client, text: string): void {
    let message: { id?: number | string; method?: string; params?: unknown };
    try {
      message = JSON.parse(text);
    } catch {
      client.socket.send(JSON.stringify({ id: null, error: { code: -32700, message: "Parse error" } }));
      return;
    }
    if (message.method === undefined) return; // an answer to a server request: none are sent
    if (message.id === undefined) {
      if (message.method === "initialized") client.initialized = true;
      return;
    }
    this.requests.push({ method: message.method, params: message.params });
    for (const seen of this.requestHandlers) seen(message.method, message.params);
    if (this.unanswered.has("*") || this.unanswered.has(message.method)) return;
    const id = message.id;
    if (this.overrides.has(message.method)) {
      client.socket.send(JSON.stringify({ id, result: this.overrides.get(message.method) }));
      return;
    }
    try {
      const result = this.handle(client, message.method, (message.params ?? {}) as Record<string, unknown>);
      client.socket.send(JSON.stringify({ id, result }));
      if (message.method === "turn/start") {
        const {
          threadId,
          turnId,
          text: input,
        } = this.lastTurnStart as { threadId: string; turnId: string; text: string };
        for (const handler of this.turnStartHandlers) handler(threadId, turnId, input);
      }
    } catch (e) {
      const code = e instanceof FakeHostError ? e.rpcCode : -32603;
      client.socket.send(JSON.stringify({ error: { code, message: (e as Error).message }, id }));
    }
  }

  private lastTurnStart: { threadId: string; turnId: string; text: string } | null = null;

  private handle(client: Client, method: string, params: Record<string, unknown>): unknown {
    if (method === "initialize") {
      client.initializing = true;
      return { userAgent: "fake/0.171.0", codexHome: this.home, platformFamily: "unix", platformOs: "linux" };
    }
    if (!client.initializing) {
      throw new FakeHostError(-32600, "Not initialized");
    }
    const threadId = typeof params.threadId === "string" ? params.threadId : "";
    switch (method) {
      case "thread/start": {
        const id = this.state.createThread({
          cwd: String(params.cwd ?? this.home),
          model: params.model as string,
        });
        const thread = this.state.snapshot(id, false);
        return {
          thread,
          model: thread.model,
          modelProvider: "mock",
          reasoningEffort: thread.reasoningEffort,
          cwd: thread.cwd,
        };
      }
      case "thread/read":
        return { thread: this.state.snapshot(threadId, params.includeTurns === true), readState: null };
      case "thread/list": {
        const all = this.state.list({
          sourceKinds: params.sourceKinds as string[] | null,
          parentThreadId: params.parentThreadId as string | null,
        });
        const from = Number(params.cursor ?? 0) || 0;
        const limit = Number(params.limit ?? 25) || 25;
        const data = all.slice(from, from + limit);
        const next = from + limit < all.length ? String(from + limit) : null;
        return { data, readStates: null, nextCursor: next, backwardsCursor: null };
      }
      case "thread/loaded/list": {
        const data = [...this.state.threads.values()]
          .filter((t) => t.thread.status.type !== "notLoaded")
          .map((t) => t.thread.id);
        return { data, nextCursor: null };
      }
      case "thread/resume": {
        const thread = this.state.resume(threadId);
        if (params.excludeTurns === true) thread.turns = [];
        return {
          thread,
          model: thread.model,
          modelProvider: "mock",
          reasoningEffort: thread.reasoningEffort,
          cwd: thread.cwd,
        };
      }
      case "turn/start": {
        const input = (params.input ?? []) as Array<{ type: string; text?: string }>;
        const text = input.map((part) => part.text ?? "").join("\n");
        const turnId = this.state.startTurn(threadId, text);
        this.lastTurnStart = { threadId, turnId, text };
        return { turn: structuredClone(this.state.turn(threadId, turnId)) };
      }
      case "turn/interrupt":
        return this.interrupt(threadId, String(params.turnId ?? ""));
      default:
        throw new FakeHostError(-32600, `Invalid request: unknown variant \`${method}\``);
    }
  }
}
