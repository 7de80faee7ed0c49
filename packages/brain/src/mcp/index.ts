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
export const mcpServerConfigSchema = z
  .object({
    command: z.string().min(1).max(4096),
    args: z.array(z.string().max(4096)).max(256).default([]),
    /** Added to the SDK's minimal default environment (PATH, HOME, ...). */
    env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
    cwd: z.string().min(1).max(4096).optional(),
    /** Bound of the start (connect and tool listing) and of each call. */
    timeoutMs: z.number().int().min(100).max(600_000).default(30_000),
    /** The server's tools change nothing: they may run in read-only turns. */
    readOnly: z.boolean().default(false),
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

export type McpErrorCode = "invalid_config" | "start_failed" | "name_clash" | "server_closed" | "call_failed";

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

/** One running server: its client, its tools, and whether it is still up. */
class McpServerConnection {
  closed = false;
  stderrTail = "";
  constructor(
    readonly name: string,
    readonly config: McpServerConfig,
    readonly client: SdkClient,
    readonly tools: readonly ListedTool[],
  ) {}
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
 * The running MCP servers of one host. `McpBridge.start` starts every configured server and lists its
 * tools (all or nothing: a server that cannot start is a typed `McpError` and the others are stopped);
 * `tools()` are the bridged host tools; `close()` stops the servers.
 */
export class McpBridge {
  readonly #servers: McpServerConnection[];
  readonly #tools: MutatingTool[];

  private constructor(servers: McpServerConnection[]) {
    this.#servers = servers;
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

  static async start(config: McpConfig): Promise<McpBridge> {
    const parsed = mcpConfigSchema.safeParse(config);
    if (!parsed.success)
      throw new McpError(
        "invalid_config",
        `MCP configuration is invalid: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
      );
    const started: McpServerConnection[] = [];
    try {
      // Started one after another, in name order: the catalog order is the same on every start.
      for (const name of Object.keys(parsed.data.servers).sort()) {
        started.push(await McpBridge.#startServer(name, parsed.data.servers[name] as McpServerConfig));
      }
      return new McpBridge(started);
    } catch (e) {
      await Promise.allSettled(started.map((s) => s.client.close()));
      throw e;
    }
  }

  static async #startServer(name: string, config: McpServerConfig): Promise<McpServerConnection> {
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
    const failed = (what: string, e: unknown) =>
      new McpError(
        "start_failed",
        `MCP server ${name} (${config.command}) ${what}: ${e instanceof Error ? e.message : String(e)}${tail ? `; stderr: ${tail.trim()}` : ""}`,
        { server: name },
        { cause: e },
      );
    try {
      await client.connect(transport, { timeout: config.timeoutMs });
    } catch (e) {
      await client.close().catch(() => {});
      throw failed("could not start", e);
    }
    const tools: ListedTool[] = [];
    try {
      let cursor: string | undefined;
      do {
        const page = await client.listTools(cursor ? { cursor } : undefined, { timeout: config.timeoutMs });
        tools.push(...page.tools);
        cursor = page.nextCursor;
      } while (cursor);
    } catch (e) {
      await client.close().catch(() => {});
      throw failed("could not list its tools", e);
    }
    const connection = new McpServerConnection(name, config, client, tools);
    const onClose = () => {
      connection.closed = true;
      connection.stderrTail = tail;
    };
    (client as unknown as { onclose?: () => void }).onclose = onClose;
    return connection;
  }

  static async #call(
    server: McpServerConnection,
    tool: string,
    bridged: string,
    args: Readonly<Record<string, unknown>>,
    ctx: ToolContext,
  ): Promise<ToolOutput> {
    if (server.closed)
      throw new McpError("server_closed", `${bridged}: MCP server ${server.name} is not running`, {
        server: server.name,
        tool,
      });
    let result: Record<string, unknown>;
    // A signal of its own per call, following the turn's: the client keeps its listener on the signal it
    // is given, and a turn's signal serves many calls.
    const call = new AbortController();
    const follow = () => call.abort(ctx.signal.reason);
    if (ctx.signal.aborted) follow();
    else ctx.signal.addEventListener("abort", follow, { once: true });
    try {
      result = await server.client.callTool({ name: tool, arguments: { ...args } }, undefined, {
        timeout: server.config.timeoutMs,
        signal: call.signal,
      });
    } catch (e) {
      throw new McpError(
        server.closed ? "server_closed" : "call_failed",
        `${bridged}: ${e instanceof Error ? e.message : String(e)}`,
        { server: server.name, tool },
        { cause: e },
      );
    } finally {
      ctx.signal.removeEventListener("abort", follow);
    }
    return { content: resultText(result), ...(result.isError === true ? { isError: true } : {}) };
  }

  /** The bridged tools, in server-name then server order. */
  tools(): MutatingTool[] {
    return [...this.#tools];
  }

  /** Each server with its bridged tool names and whether it still runs. */
  servers(): { name: string; tools: string[]; running: boolean }[] {
    return this.#servers.map((s) => ({
      name: s.name,
      tools: s.tools.map((t) => bridgedToolName(s.name, t.name)),
      running: !s.closed,
    }));
  }

  async close(): Promise<void> {
    await Promise.allSettled(this.#servers.map((s) => s.client.close()));
  }
}

function defaultEnv(): Record<string, string> {
  const keep = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "TMPDIR", "LANG"];
  const env: Record<string, string> = {};
  for (const k of keep) {
    const v = process.env[k];
    if (v !== undefined) env[k] = v;
  }
  return env;
}
