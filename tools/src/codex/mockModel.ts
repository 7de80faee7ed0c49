import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A mock of the OpenAI Responses API on 127.0.0.1 for Codex's custom model provider: `POST /v1/responses`
 * answered as a server-sent event stream in the real order (response.created; per output item
 * response.output_item.added, response.output_text.delta …, response.output_item.done;
 * response.completed with usage). Each request is answered by the first script entry that matches it
 * (by thread, by a predicate on the request) or by the fallback handler; a request nothing answers gets
 * HTTP 500, which Codex reports as a failed turn.
 */

export interface ModelRequest {
  /** x-codex-turn-metadata's thread_id (the thread the turn runs on). */
  threadId: string | null;
  turnId: string | null;
  /** x-codex-parent-thread-id: set for a subagent's request. */
  parentThreadId: string | null;
  model: string;
  body: Record<string, unknown>;
  input: Array<Record<string, unknown>>;
  tools: Array<Record<string, unknown>>;
  headers: Record<string, string | string[] | undefined>;
}

export type OutputItem =
  | { type: "message"; text: string; phase?: "commentary" | "final_answer" | null }
  | {
      type: "function_call";
      name: string;
      /** Read it from the request's tools (`toolNamespace`); multi-agent v1 tools use `multi_agent_v1`. */
      namespace?: string;
      arguments: unknown;
      callId?: string;
    };

export interface Usage {
  input: number;
  cached_input?: number;
  output: number;
  reasoning_output?: number;
  total?: number;
}

export interface ModelReply {
  items: OutputItem[];
  usage?: Usage;
  /** Answer with this HTTP status instead (e.g. 429, 500), with `error` as the body's error object. */
  status?: number;
  error?: { type?: string; code?: string; message?: string; [key: string]: unknown };
  /** Stream response.created then response.failed with this error (e.g. code context_length_exceeded). */
  failed?: { code: string; message?: string };
}

export type ModelHandler = (request: ModelRequest) => ModelReply | Promise<ModelReply> | undefined;

interface ScriptEntry {
  match: (request: ModelRequest) => boolean;
  handler: ModelHandler;
  once: boolean;
}

const defaultUsage: Usage = { input: 100, cached_input: 0, output: 20, reasoning_output: 0 };

export class MockModel {
  readonly requests: ModelRequest[] = [];
  private readonly script: ScriptEntry[] = [];
  private fallback: ModelHandler | null = null;

  private constructor(private readonly server: Server) {}

  static async start(): Promise<MockModel> {
    let model: MockModel | null = null;
    const server = createServer((req, res) => {
      model?.serve(req, res).catch((e: unknown) => {
        if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
        res.end(String(e));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    model = new MockModel(server);
    return model;
  }

  /** The provider's base_url (config.toml `model_providers.<id>.base_url`). */
  get baseUrl(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
  }

  /** Answer requests that match (every time, or once with `once`). Earlier entries win. */
  on(
    match: (request: ModelRequest) => boolean,
    handler: ModelHandler,
    options: { once?: boolean } = {},
  ): this {
    this.script.push({ match, handler, once: options.once ?? false });
    return this;
  }

  /** Answer every request nothing else answered. */
  otherwise(handler: ModelHandler): this {
    this.fallback = handler;
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== "POST" || !req.url?.endsWith("/responses")) {
      res.writeHead(404).end();
      return;
    }
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>;
    const request = toModelRequest(body, req.headers);
    this.requests.push(request);
    let reply: ModelReply | undefined;
    for (const entry of this.script) {
      if (!entry.match(request)) continue;
      reply = await entry.handler(request);
      if (reply === undefined) continue;
      if (entry.once) this.script.splice(this.script.indexOf(entry), 1);
      break;
    }
    reply ??= (await this.fallback?.(request)) ?? undefined;
    if (!reply) {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "the mock model has no answer for this request" } }));
      return;
    }
    if (reply.status && reply.status !== 200) {
      res.writeHead(reply.status, { "content-type": "application/json" });
      res.end(
        JSON.stringify({ error: { message: `mock status ${reply.status}`, type: "mock", ...reply.error } }),
      );
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    for (const event of streamEvents(reply))
      res.write(`event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`);
    res.end();
  }
}

function header(headers: IncomingMessage["headers"], name: string): string | null {
  const value = headers[name];
  return Array.isArray(value) ? (value[0] ?? null) : (value ?? null);
}

function toModelRequest(body: Record<string, unknown>, headers: IncomingMessage["headers"]): ModelRequest {
  let metadata: Record<string, unknown> = {};
  try {
    metadata = JSON.parse(header(headers, "x-codex-turn-metadata") ?? "{}") as Record<string, unknown>;
  } catch {}
  return {
    threadId: typeof metadata.thread_id === "string" ? metadata.thread_id : null,
    turnId: typeof metadata.turn_id === "string" ? metadata.turn_id : null,
    parentThreadId: header(headers, "x-codex-parent-thread-id"),
    model: String(body.model ?? ""),
    body,
    input: Array.isArray(body.input) ? (body.input as Array<Record<string, unknown>>) : [],
    tools: Array.isArray(body.tools) ? (body.tools as Array<Record<string, unknown>>) : [],
    headers,
  };
}

/** The SSE events of one response, in the real order. */
export function streamEvents(reply: ModelReply): Array<Record<string, unknown> & { type: string }> {
  const responseId = `resp_${randomUUID().replaceAll("-", "")}`;
  const events: Array<Record<string, unknown> & { type: string }> = [];
  events.push({
    type: "response.created",
    response: { id: responseId, object: "response", status: "in_progress", output: [] },
  });
  if (reply.failed) {
    events.push({
      type: "response.failed",
      response: {
        id: responseId,
        object: "response",
        status: "failed",
        error: { code: reply.failed.code, message: reply.failed.message ?? reply.failed.code },
      },
    });
    return events;
  }
  const done: unknown[] = [];
  reply.items.forEach((item, index) => {
    if (item.type === "message") {
      const id = `msg_${randomUUID().replaceAll("-", "")}`;
      const base = { type: "message", id, role: "assistant", ...(item.phase ? { phase: item.phase } : {}) };
      events.push({
        type: "response.output_item.added",
        output_index: index,
        item: { ...base, status: "in_progress", content: [] },
      });
      events.push({
        type: "response.output_text.delta",
        item_id: id,
        output_index: index,
        content_index: 0,
        delta: item.text,
      });
      const full = {
        ...base,
        status: "completed",
        content: [{ type: "output_text", text: item.text, annotations: [] }],
      };
      events.push({ type: "response.output_item.done", output_index: index, item: full });
      done.push(full);
    } else {
      const id = `fc_${randomUUID().replaceAll("-", "")}`;
      const args = typeof item.arguments === "string" ? item.arguments : JSON.stringify(item.arguments);
      const full = {
        type: "function_call",
        id,
        call_id: item.callId ?? `call_${randomUUID().replaceAll("-", "")}`,
        name: item.name,
        ...(item.namespace ? { namespace: item.namespace } : {}),
        arguments: args,
        status: "completed",
      };
      events.push({
        type: "response.output_item.added",
        output_index: index,
        item: { ...full, arguments: "" },
      });
      events.push({ type: "response.output_item.done", output_index: index, item: full });
      done.push(full);
    }
  });
  const usage = reply.usage ?? defaultUsage;
  events.push({
    type: "response.completed",
    response: {
      id: responseId,
      object: "response",
      status: "completed",
      output: done,
      usage: {
        input_tokens: usage.input,
        input_tokens_details: { cached_tokens: usage.cached_input ?? 0 },
        output_tokens: usage.output,
        output_tokens_details: { reasoning_tokens: usage.reasoning_output ?? 0 },
        total_tokens: usage.total ?? usage.input + usage.output,
      },
    },
  });
  return events;
}

// ---- reading a request ----------------------------------------------------------------------------

/** The text of every user message of the request's input, oldest first. */
export function userTexts(request: ModelRequest): string[] {
  return request.input
    .filter((item) => item.type === "message" && item.role === "user")
    .map((item) => contentText(item.content));
}

/** The outputs of earlier function calls (`function_call_output`), oldest first. */
export function functionOutputs(request: ModelRequest): Array<{ callId: string; output: string }> {
  return request.input
    .filter((item) => item.type === "function_call_output")
    .map((item) => ({ callId: String(item.call_id), output: contentText(item.output) }));
}

/** The function calls the model made earlier in this thread's history. */
export function functionCalls(
  request: ModelRequest,
): Array<{ callId: string; name: string; arguments: string }> {
  return request.input
    .filter((item) => item.type === "function_call")
    .map((item) => ({
      callId: String(item.call_id),
      name: String(item.name),
      arguments: String(item.arguments),
    }));
}

/** The namespace a tool is offered under (e.g. `multi_agent_v1` for spawn_agent), or undefined. */
export function toolNamespace(request: ModelRequest, name: string): string | undefined {
  for (const tool of request.tools) {
    if (tool.name === name) return typeof tool.namespace === "string" ? tool.namespace : undefined;
    if (tool.type === "namespace" && Array.isArray(tool.tools)) {
      const inner = (tool.tools as Array<Record<string, unknown>>).find((t) => t.name === name);
      if (inner) return String(tool.name);
    }
  }
  return undefined;
}

export function toolNames(request: ModelRequest): string[] {
  const names: string[] = [];
  for (const tool of request.tools) {
    if (tool.type === "namespace" && Array.isArray(tool.tools)) {
      for (const inner of tool.tools as Array<Record<string, unknown>>)
        names.push(`${tool.name}.${inner.name}`);
    } else names.push(String(tool.name ?? tool.type));
  }
  return names;
}

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => (typeof part === "object" && part && "text" in part ? String(part.text) : ""))
      .join("");
  }
  if (content && typeof content === "object" && "content" in content) return contentText(content.content);
  return content === undefined || content === null ? "" : JSON.stringify(content);
}
