import { createHash } from "node:crypto";
import { z } from "zod";
import type { MutatingTool } from "../delegation/scopedTools.js";
import type { ToolContext, ToolOutput } from "../delegation/turn.js";

/**
 * MCP servers' tools bridged into a session's tool catalog. Each configured server is a process started
 * with its command (stdio transport, the official SDK's client); its tools become host tools named
 * `mcp__<server>__<tool>` that run where the bridge lives (the daemon), for root sessions and delegated
 * children alike. Scope rules apply by the bridged name like any host tool; a server marked `readOnly`
 * (or a tool annotated `readOnlyHint`) may run in a read-only turn, every other one is refused there.
 * Whether a bridged tool is declared directly or through the deferred catalog is the catalog policy's
 * decision (`withToolCatalog`), never the bridge's.
 */
/** How a server that exits is started again: bounded exponential backoff, then it stays down. */
export const mcpRestartSchema = z
  .object({
    /** Consecutive failed starts before the server stays down; 0 never restarts it. */
    maxAttempts: z.number().int().min(0).max(100).default(5),
    /** Delay before the first attempt; each later attempt doubles it up to `maxDelayMs`. */
    initialDelayMs: z.number().int().min(10).max(600_000).default(500),
    maxDelayMs: z.number().int().min(10).max(3_600_000).default(30_000),
  })
  .strict()
  .refine((r) => r.maxDelayMs >= r.initialDelayMs, { message: "maxDelayMs must be >= initialDelayMs" });

export const mcpServerConfigSchema = z
  .object({
    command: z.string().min(1).max(4096),
    args: z.array(z.string().max(4096)).max(256).default([]),
    /** Added to the SDK's minimal default environment (PATH, HOME, ...). */
    env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
    cwd: z.string().min(1).max(4096).optional(),
    /** Bound of each call (and of the start, unless `startTimeoutMs` is given). */
    timeoutMs: z.number().int().min(100).max(600_000).default(30_000),
    /** Bound of a start: spawn, initialize and tool listing. */
    startTimeoutMs: z.number().int().min(100).max(600_000).optional(),
    /** The server's tools change nothing: they may run in read-only turns. */
    readOnly: z.boolean().default(false),
    /** Restart of a server that exits (crash, kill): backoff bounds. */
    restart: mcpRestartSchema.default({ maxAttempts: 5, initialDelayMs: 500, maxDelayMs: 30_000 }),
  })
  .strict();

export const MCP_SERVER_NAME = /^[A-Za-z0-9_-]{1,32}$/;

/** The daemon configuration's `mcp` section. */
export const mcpConfigSchema = z
  .object({
    servers: z.record(z.string().regex(MCP_SERVER_NAME), mcpServerConfigSchema).default({}),
  })
  .strict();
export type McpConfig = z.input<typeof mcpConfigSchema>;
export type McpServerConfig = z.output<typeof mcpServerConfigSchema>;

export type McpErrorCode =
  | "invalid_config"
  | "start_failed"
  | "name_clash"
  | "server_closed"
  | "call_failed"
  | "call_timeout";

export class McpError extends Error {
  override readonly name = "McpError";
  constructor(
    readonly code: McpErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

const MAX_TOOL_NAME = 64;

/** `mcp__<server>__<tool>`, limited to the characters and length every provider accepts. */
export function bridgedToolName(server: string, tool: string): string {
  const name = `mcp__${server}__${tool.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  if (name.length <= MAX_TOOL_NAME) return name;
  const digest = createHash("sha256").update(name).digest("hex").slice(0, 8);
  return `${name.slice(0, MAX_TOOL_NAME - 9)}_${digest}`;
}

interface ListedTool {
  readonly name: string;
  readonly description?: string | undefined;
  readonly inputSchema: Record<string, unknown>;
  readonly annotations?: { readonly readOnlyHint?: boolean | undefined } | undefined;
}

interface SdkClient {
  connect(transport: unknown, options?: { timeout?: number }): Promise<void>;
  listTools(
    params?: { cursor?: string },
    options?: { timeout?: number },
  ): Promise<{ tools: ListedTool[]; nextCursor?: string | undefined }>;
  callTool(
    params: { name: string; arguments: Record<string, unknown> },
    resultSchema?: undefined,
    options?: { timeout?: number; signal?: AbortSignal },
  ): Promise<Record<string, unknown>>;
  close(): Promise<void>;
}

/** One connected process of a server: its client, the tools it listed, when it came up. */
interface McpConnection {
  readonly client: SdkClient;
  readonly tools: readonly ListedTool[];
  readonly pid: number | null;
  readonly since: number;
  stderrTail(): string;
}

/** Where a configured server is: up, waiting for its next start attempt, given up on, or closed by the host. */
export type McpServerState = "running" | "restarting" | "failed" | "stopped";

/** What the bridge reports about its servers' lives (the daemon logs them). */
export type McpBridgeEvent =
  | { type: "server_exited"; server: string; stderr: string; willRestart: boolean }
  | { type: "restart_failed"; server: string; attempt: number; error: McpError; nextDelayMs: number | null }
  | {
      type: "server_restarted";
      server: string;
      attempt: number;
      pid: number | null;
      /** Bridged names the restarted server lists and the declared catalog lacks, and the reverse. */
      toolsAdded: string[];
      toolsRemoved: string[];
      toolsChanged: boolean;
    }
  | { type: "server_failed"; server: string; attempts: number; reason: string };

export interface McpBridgeOptions {
  readonly onEvent?: (event: McpBridgeEvent) => void;
}

/**
 * One configured server over its whole life. Its declared tools are those listed at the bridge's start
 * and never change (a running session's catalog is stable); a restart re-lists them and reports a
 * difference. While it is down a call is answered with `server_closed` at once.
 */
class McpServerSlot {
  state: McpServerState = "running";
  connection: McpConnection | null;
  /** Consecutive failed start attempts since the last exit. */
  attempts = 0;
  restarts = 0;
  lastError: string | null = null;
  timer: NodeJS.Timeout | null = null;
  constructor(
    readonly name: string,
    readonly config: McpServerConfig,
    readonly tools: readonly ListedTool[],
    connection: McpConnection,
  ) {
    this.connection = connection;
  }
}

function toolFingerprint(tool: ListedTool): string {
  return JSON.stringify([tool.description ?? null, tool.inputSchema, tool.annotations?.readOnlyHint ?? null]);
}

function resultText(result: Record<string, unknown>): string {
  const parts: string[] = [];
  const content = Array.isArray(result.content) ? (result.content as Record<string, unknown>[]) : [];
  for (const part of content) {
    if (part.type === "text" && typeof part.text === "string") parts.push(part.text);
    else if (part.type === "resource" && typeof part.resource === "object" && part.resource !== null) {
      const r = part.resource as Record<string, unknown>;
      parts.push(typeof r.text === "string" ? r.text : `[resource ${String(r.uri)}]`);
    } else parts.push(`[${String(part.type)} content]`);
  }
  if (parts.length === 0 && result.structuredContent !== undefined)
    parts.push(JSON.stringify(result.structuredContent));
  if (parts.length === 0 && "toolResult" in result) parts.push(JSON.stringify(result.toolResult));
  return parts.join("\n");
}

/**
 * The MCP servers of one host. `McpBridge.start` starts every configured server and lists its tools (all
 * or nothing: a server that cannot start is a typed `McpError` and the others are stopped); `tools()` are
 * the bridged host tools, fixed at start; `close()` stops the servers. A server that exits afterwards is
 * started again with bounded exponential backoff (its `restart` config); after `maxAttempts` consecutive
 * failed starts it stays down and `servers()` says why.
 */
export class McpBridge {
  readonly #servers: McpServerSlot[];
  readonly #tools: MutatingTool[];
  readonly #onEvent: (event: McpBridgeEvent) => void;
  #closing = false;

  private constructor(servers: McpServerSlot[], options: McpBridgeOptions) {
    this.#servers = servers;
    this.#onEvent = options.onEvent ?? (() => {});
    const seen = new Map<string, string>();
    this.#tools = servers.flatMap((server) =>
      server.tools.map((tool): MutatingTool => {
        const name = bridgedToolName(server.name, tool.name);
        const other = seen.get(name);
        if (other !== undefined)
          throw new McpError(
            "name_clash",
            `MCP tools ${other} and ${server.name}/${tool.name} share the name ${name}`,
            {
              name,
            },
          );
        seen.set(name, `${server.name}/${tool.name}`);
        const readOnly = server.config.readOnly || tool.annotations?.readOnlyHint === true;
        return {
          name,
          description: `${tool.description ?? tool.name} (MCP server ${server.name})`,
          parameters: { type: "object", ...tool.inputSchema },
          mutates: !readOnly,
          execute: (args, ctx) => McpBridge.#call(server, tool.name, name, args, ctx),
        };
      }),
    );
  }

  static async start(config: McpConfig, options: McpBridgeOptions = {}): Promise<McpBridge> {
    const parsed = mcpConfigSchema.safeParse(config);
    if (!parsed.success)
      throw new McpError(
        "invalid_config",
        `MCP configuration is invalid: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
      );
    const started: McpServerSlot[] = [];
    try {
      // Started one after another, in name order: the catalog order is the same on every start.
      for (const name of Object.keys(parsed.data.servers).sort()) {
        const config = parsed.data.servers[name] as McpServerConfig;
        const connection = await McpBridge.#connect(name, config);
        started.push(new McpServerSlot(name, config, connection.tools, connection));
      }
      const bridge = new McpBridge(started, options);
      for (const slot of started) bridge.#watch(slot);
      return bridge;
    } catch (e) {
      await Promise.allSettled(started.map((s) => s.connection?.client.close()));
      throw e;
    }
  }

  /** Starts the server's process, initializes the session and lists its tools (paged), bounded by timeoutMs. */
  static async #connect(name: string, config: McpServerConfig): Promise<McpConnection> {
    const [{ Client }, { StdioClientTransport }] = await Promise.all([
      import("@modelcontextprotocol/sdk/client/index.js"),
      import("@modelcontextprotocol/sdk/client/stdio.js"),
    ]);
    const transport = new StdioClientTransport({
      command: config.command,
      args: config.args,
      ...(config.env ? { env: { ...defaultEnv(), ...config.env } } : {}),
      ...(config.cwd ? { cwd: config.cwd } : {}),
      stderr: "pipe",
    });
    let tail = "";
    transport.stderr?.on("data", (chunk: Buffer) => {
      tail = (tail + chunk.toString("utf8")).slice(-2000);
    });
    const client = new Client({ name: "crw", version: "0.1.0" }) as unknown as SdkClient;
    const startTimeout = config.startTimeoutMs ?? config.timeoutMs;
    const failed = (what: string, e: unknown) =>
      new McpError(
        "start_failed",
        `MCP server ${name} (${config.command}) ${what}: ${e instanceof Error ? e.message : String(e)}${tail ? `; stderr: ${tail.trim()}` : ""}`,
        { server: name },
        { cause: e },
      );
    try {
      await client.connect(transport, { timeout: startTimeout });
    } catch (e) {
      await client.close().catch(() => {});
      throw failed("could not start", e);
    }
    const tools: ListedTool[] = [];
    try {
      let cursor: string | undefined;
      do {
        const page = await client.listTools(cursor ? { cursor } : undefined, { timeout: startTimeout });
        tools.push(...page.tools);
        cursor = page.nextCursor;
      } while (cursor);
    } catch (e) {
      await client.close().catch(() => {});
      throw failed("could not list its tools", e);
    }
    return { client, tools, pid: transport.pid ?? null, since: Date.now(), stderrTail: () => tail };
  }

  /** Follows the slot's current connection: its close (not the host's) starts the restart. */
  #watch(slot: McpServerSlot): void {
    const connection = slot.connection;
    if (!connection) return;
    (connection.client as unknown as { onclose?: () => void }).onclose = () => {
      if (slot.connection !== connection) return;
      slot.connection = null;
      if (this.#closing) {
        slot.state = "stopped";
        return;
      }
      const stderr = connection.stderrTail().trim();
      // A server that ran at least as long as the longest backoff delay starts a fresh series of attempts.
      if (Date.now() - connection.since >= slot.config.restart.maxDelayMs) slot.attempts = 0;
      slot.lastError = `exited${stderr ? `; stderr: ${stderr.slice(-500)}` : ""}`;
      const willRestart = slot.attempts < slot.config.restart.maxAttempts;
      this.#onEvent({ type: "server_exited", server: slot.name, stderr, willRestart });
      if (willRestart) this.#schedule(slot);
      else this.#giveUp(slot);
    };
  }

  #delay(slot: McpServerSlot): number {
    const { initialDelayMs, maxDelayMs } = slot.config.restart;
    return Math.min(maxDelayMs, initialDelayMs * 2 ** Math.min(slot.attempts, 30));
  }

  #schedule(slot: McpServerSlot): void {
    slot.state = "restarting";
    slot.timer = setTimeout(() => {
      slot.timer = null;
      void this.#attempt(slot);
    }, this.#delay(slot));
    slot.timer.unref();
  }

  #giveUp(slot: McpServerSlot): void {
    slot.state = "failed";
    this.#onEvent({
      type: "server_failed",
      server: slot.name,
      attempts: slot.attempts,
      reason: slot.lastError ?? "exited",
    });
  }

  async #attempt(slot: McpServerSlot): Promise<void> {
    if (this.#closing) return;
    slot.attempts++;
    let connection: McpConnection;
    try {
      connection = await McpBridge.#connect(slot.name, slot.config);
    } catch (e) {
      const error =
        e instanceof McpError
          ? e
          : new McpError("start_failed", String(e), { server: slot.name }, { cause: e });
      slot.lastError = error.message;
      const more = slot.attempts < slot.config.restart.maxAttempts && !this.#closing;
      this.#onEvent({
        type: "restart_failed",
        server: slot.name,
        attempt: slot.attempts,
        error,
        nextDelayMs: more ? this.#delay(slot) : null,
      });
      if (this.#closing) slot.state = "stopped";
      else if (more) this.#schedule(slot);
      else this.#giveUp(slot);
      return;
    }
    if (this.#closing) {
      await connection.client.close().catch(() => {});
      slot.state = "stopped";
      return;
    }
    slot.connection = connection;
    slot.state = "running";
    slot.restarts++;
    const attempt = slot.attempts;
    slot.attempts = 0;
    slot.lastError = null;
    this.#watch(slot);
    const declared = new Map(slot.tools.map((t) => [t.name, toolFingerprint(t)]));
    const listed = new Map(connection.tools.map((t) => [t.name, toolFingerprint(t)]));
    const toolsAdded = [...listed.keys()]
      .filter((n) => !declared.has(n))
      .map((n) => bridgedToolName(slot.name, n));
    const toolsRemoved = [...declared.keys()]
      .filter((n) => !listed.has(n))
      .map((n) => bridgedToolName(slot.name, n));
    const toolsChanged =
      toolsAdded.length > 0 ||
      toolsRemoved.length > 0 ||
      [...declared].some(([n, f]) => listed.has(n) && listed.get(n) !== f);
    this.#onEvent({
      type: "server_restarted",
      server: slot.name,
      attempt,
      pid: connection.pid,
      toolsAdded,
      toolsRemoved,
      toolsChanged,
    });
  }

  static async #call(
    server: McpServerSlot,
    tool: string,
    bridged: string,
    args: Readonly<Record<string, unknown>>,
    ctx: ToolContext,
  ): Promise<ToolOutput> {
    const connection = server.connection;
    if (!connection)
      throw new McpError(
        "server_closed",
        `${bridged}: MCP server ${server.name} is not running (${server.state}${server.lastError ? `: ${server.lastError}` : ""})`,
        { server: server.name, tool, state: server.state },
      );
    let result: Record<string, unknown>;
    // A signal of its own per call, following the turn's: the client keeps its listener on the signal it
    // is given, and a turn's signal serves many calls. Its abort (and the call's timeout) sends the
    // server MCP's cancellation notification for the request.
    const call = new AbortController();
    const follow = () => call.abort(ctx.signal.reason);
    if (ctx.signal.aborted) follow();
    else ctx.signal.addEventListener("abort", follow, { once: true });
    try {
      result = await connection.client.callTool({ name: tool, arguments: { ...args } }, undefined, {
        timeout: server.config.timeoutMs,
        signal: call.signal,
      });
    } catch (e) {
      const timedOut = (e as { code?: unknown }).code === REQUEST_TIMEOUT && !call.signal.aborted;
      const code: McpErrorCode =
        server.connection !== connection ? "server_closed" : timedOut ? "call_timeout" : "call_failed";
      throw new McpError(
        code,
        `${bridged}: ${timedOut ? `no answer within ${server.config.timeoutMs} ms (cancelled on the server)` : e instanceof Error ? e.message : String(e)}`,
        { server: server.name, tool },
        { cause: e },
      );
    } finally {
      ctx.signal.removeEventListener("abort", follow);
    }
    return { content: resultText(result), ...(result.isError === true ? { isError: true } : {}) };
  }

  /** The bridged tools, in server-name then server order; the same for the bridge's whole life. */
  tools(): MutatingTool[] {
    return [...this.#tools];
  }

  /** Each server with its declared bridged tool names, whether it runs, and why not. */
  servers(): {
    name: string;
    tools: string[];
    running: boolean;
    state: McpServerState;
    pid: number | null;
    restarts: number;
    attempts: number;
    lastError: string | null;
  }[] {
    return this.#servers.map((s) => ({
      name: s.name,
      tools: s.tools.map((t) => bridgedToolName(s.name, t.name)),
      running: s.state === "running",
      state: s.state,
      pid: s.connection?.pid ?? null,
      restarts: s.restarts,
      attempts: s.attempts,
      lastError: s.lastError,
    }));
  }

  async close(): Promise<void> {
    this.#closing = true;
    await Promise.allSettled(
      this.#servers.map(async (s) => {
        if (s.timer) clearTimeout(s.timer);
        s.timer = null;
        const connection = s.connection;
        s.state = "stopped";
        s.connection = null;
        await connection?.client.close();
      }),
    );
  }
}

/** The SDK's JSON-RPC code of a request that timed out (it has sent the cancellation notification). */
const REQUEST_TIMEOUT = -32001;

function defaultEnv(): Record<string, string> {
  const keep = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "TMPDIR", "LANG"];
  const env: Record<string, string> = {};
  for (const k of keep) {
    const v = process.env[k];
    if (v !== undefined) env[k] = v;
  }
  return env;
}
