import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A model server on loopback that speaks the real streaming wire protocols (OpenAI Chat Completions, OpenAI
 * Responses, Anthropic Messages) with scripted answers, so the real pi-ai clients run end to end offline.
 */
export type FakeReply =
  | { text: string; thinking?: FakeThinking }
  | { tool: { id: string; name: string; arguments: Record<string, unknown> }; thinking?: FakeThinking }
  | { status: number };

/** An extended-thinking block sent before the reply's own block (Anthropic Messages only). */
export interface FakeThinking {
  readonly thinking: string;
  readonly signature: string;
}

function anthropicThinking(thinking: FakeThinking | undefined): { event: string; data: unknown }[] {
  if (!thinking) return [];
  return [
    {
      event: "content_block_start",
      data: { type: "content_block_start", index: 0, content_block: { type: "thinking", thinking: "" } },
    },
    {
      event: "content_block_delta",
      data: {
        type: "content_block_delta",
        index: 0,
        delta: { type: "thinking_delta", thinking: thinking.thinking },
      },
    },
    {
      event: "content_block_delta",
      data: {
        type: "content_block_delta",
        index: 0,
        delta: { type: "signature_delta", signature: thinking.signature },
      },
    },
    { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
  ];
}

/** Shifts a block's index past a leading thinking block. */
function shifted(events: { event: string; data: unknown }[], by: number): { event: string; data: unknown }[] {
  if (by === 0) return events;
  return events.map((e) => {
    const data = e.data as { index?: number };
    return typeof data.index === "number" ? { ...e, data: { ...data, index: data.index + by } } : e;
  });
}

export interface FakeModelServer {
  readonly url: string;
  readonly requests: { path: string; headers: IncomingMessage["headers"]; body: Record<string, unknown> }[];
  close(): Promise<void>;
}

function sse(events: { event?: string; data: unknown }[]): string {
  return events
    .map(
      (e) =>
        `${e.event ? `event: ${e.event}\n` : ""}data: ${typeof e.data === "string" ? e.data : JSON.stringify(e.data)}\n\n`,
    )
    .join("");
}

function completions(reply: FakeReply): string {
  const base = { id: "chatcmpl-1", object: "chat.completion.chunk", created: 0, model: "fake" };
  if ("text" in reply) {
    return sse([
      {
        data: {
          ...base,
          choices: [{ index: 0, delta: { role: "assistant", content: reply.text }, finish_reason: null }],
        },
      },
      {
        data: {
          ...base,
          choices: [{ index: 0, delta: {}, finish_reason: "stop" }],
          usage: { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 },
        },
      },
      { data: "[DONE]" },
    ]);
  }
  if (!("tool" in reply)) return "";
  const call = {
    index: 0,
    id: reply.tool.id,
    type: "function",
    function: { name: reply.tool.name, arguments: JSON.stringify(reply.tool.arguments) },
  };
  return sse([
    {
      data: {
        ...base,
        choices: [{ index: 0, delta: { role: "assistant", tool_calls: [call] }, finish_reason: null }],
      },
    },
    {
      data: {
        ...base,
        choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }],
        usage: { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 },
      },
    },
    { data: "[DONE]" },
  ]);
}

/** The usage an Anthropic Messages response reports (`message_start`). */
export interface AnthropicUsage {
  readonly input: number;
  readonly output: number;
  readonly cacheRead: number;
  readonly cacheWrite: number;
}

const strip = (v: unknown): unknown =>
  Array.isArray(v)
    ? v.map(strip)
    : v && typeof v === "object"
      ? Object.fromEntries(
          Object.entries(v as Record<string, unknown>)
            .filter(([k]) => k !== "cache_control")
            .map(([k, x]) => [k, strip(x)]),
        )
      : v;

/**
 * A model of Anthropic's prompt cache, per server: a request's prompt is a sequence of blocks (the system
 * blocks, the tool declarations, then every content block of every message with its role); the cache
 * holds the digest of every block prefix an earlier request sent. A request reads from the cache the
 * longest of its block prefixes stored there and writes the rest; tokens are characters / 4. Cache markers
 * (`cache_control`) are not part of the prompt's identity, as on the real service.
 */
export class PromptCacheModel {
  readonly #stored = new Set<string>();

  usage(body: Record<string, unknown>): AnthropicUsage {
    const messages = (body.messages ?? []) as { role: string; content: unknown }[];
    const blocks = [
      JSON.stringify(strip(body.system ?? null)),
      JSON.stringify(strip(body.tools ?? null)),
      ...messages.flatMap((m) =>
        (typeof m.content === "string" ? [{ type: "text", text: m.content }] : (m.content as unknown[])).map(
          (b) => JSON.stringify({ role: m.role, block: strip(b) }),
        ),
      ),
    ];
    const hash = createHash("sha256");
    let chars = 0;
    let readChars = 0;
    const digests: string[] = [];
    for (const block of blocks) {
      hash.update(block);
      chars += block.length;
      const digest = hash.copy().digest("hex");
      digests.push(digest);
      if (this.#stored.has(digest)) readChars = chars;
    }
    for (const d of digests) this.#stored.add(d);
    const tokens = (n: number) => Math.ceil(n / 4);
    const cacheRead = tokens(readChars);
    return { input: 1, output: 3, cacheRead, cacheWrite: tokens(chars) - cacheRead };
  }

  /** Forgets everything (an evicted cache). */
  clear(): void {
    this.#stored.clear();
  }
}

function anthropic(reply: FakeReply, usage?: AnthropicUsage): string {
  const start = {
    event: "message_start",
    data: {
      type: "message_start",
      message: {
        id: "msg_1",
        type: "message",
        role: "assistant",
        model: "fake",
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: usage
          ? {
              input_tokens: usage.input,
              output_tokens: 1,
              cache_read_input_tokens: usage.cacheRead,
              cache_creation_input_tokens: usage.cacheWrite,
            }
          : { input_tokens: 11, output_tokens: 1 },
      },
    },
  };
  const end = (stop: string) => [
    {
      event: "message_delta",
      data: {
        type: "message_delta",
        delta: { stop_reason: stop, stop_sequence: null },
        usage: { output_tokens: usage?.output ?? 3 },
      },
    },
    { event: "message_stop", data: { type: "message_stop" } },
  ];
  if ("status" in reply) return "";
  const thinking = anthropicThinking(reply.thinking);
  const by = thinking.length > 0 ? 1 : 0;
  if ("text" in reply) {
    return sse([
      start,
      ...thinking,
      ...shifted(
        [
          {
            event: "content_block_start",
            data: { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
          },
          {
            event: "content_block_delta",
            data: { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: reply.text } },
          },
          { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
        ],
        by,
      ),
      ...end("end_turn"),
    ]);
  }
  return sse([
    start,
    ...thinking,
    ...shifted(
      [
        {
          event: "content_block_start",
          data: {
            type: "content_block_start",
            index: 0,
            content_block: { type: "tool_use", id: reply.tool.id, name: reply.tool.name, input: {} },
          },
        },
        {
          event: "content_block_delta",
          data: {
            type: "content_block_delta",
            index: 0,
            delta: { type: "input_json_delta", partial_json: JSON.stringify(reply.tool.arguments) },
          },
        },
        { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
      ],
      by,
    ),
    ...end("tool_use"),
  ]);
}

function responses(reply: FakeReply): string {
  const usage = {
    input_tokens: 11,
    output_tokens: 3,
    total_tokens: 14,
    input_tokens_details: { cached_tokens: 0 },
  };
  if ("text" in reply) {
    const item = {
      type: "message",
      id: "msg_1",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text: reply.text, annotations: [] }],
    };
    return sse([
      {
        event: "response.created",
        data: { type: "response.created", response: { id: "resp_1", status: "in_progress", output: [] } },
      },
      {
        event: "response.output_item.added",
        data: {
          type: "response.output_item.added",
          output_index: 0,
          item: { ...item, status: "in_progress", content: [] },
        },
      },
      {
        event: "response.content_part.added",
        data: {
          type: "response.content_part.added",
          item_id: "msg_1",
          output_index: 0,
          content_index: 0,
          part: { type: "output_text", text: "", annotations: [] },
        },
      },
      {
        event: "response.output_text.delta",
        data: {
          type: "response.output_text.delta",
          item_id: "msg_1",
          output_index: 0,
          content_index: 0,
          delta: reply.text,
        },
      },
      {
        event: "response.output_item.done",
        data: { type: "response.output_item.done", output_index: 0, item },
      },
      {
        event: "response.completed",
        data: {
          type: "response.completed",
          response: { id: "resp_1", status: "completed", output: [item], usage },
        },
      },
    ]);
  }
  if (!("tool" in reply)) return "";
  const args = JSON.stringify(reply.tool.arguments);
  const item = {
    type: "function_call",
    id: "fc_1",
    call_id: reply.tool.id,
    name: reply.tool.name,
    arguments: args,
    status: "completed",
  };
  return sse([
    {
      event: "response.created",
      data: { type: "response.created", response: { id: "resp_2", status: "in_progress", output: [] } },
    },
    {
      event: "response.output_item.added",
      data: {
        type: "response.output_item.added",
        output_index: 0,
        item: { ...item, arguments: "", status: "in_progress" },
      },
    },
    {
      event: "response.function_call_arguments.delta",
      data: { type: "response.function_call_arguments.delta", item_id: "fc_1", output_index: 0, delta: args },
    },
    {
      event: "response.function_call_arguments.done",
      data: {
        type: "response.function_call_arguments.done",
        item_id: "fc_1",
        output_index: 0,
        arguments: args,
      },
    },
    {
      event: "response.output_item.done",
      data: { type: "response.output_item.done", output_index: 0, item },
    },
    {
      event: "response.completed",
      data: {
        type: "response.completed",
        response: { id: "resp_2", status: "completed", output: [item], usage },
      },
    },
  ]);
}

export async function startFakeModelServer(
  replies: FakeReply[],
  options: { readonly promptCache?: PromptCacheModel } = {},
): Promise<FakeModelServer> {
  const requests: FakeModelServer["requests"] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>;
      requests.push({ path: req.url ?? "", headers: req.headers, body });
      const reply = replies.shift() ?? { text: "out of script" };
      if ("status" in reply) {
        res.writeHead(reply.status, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "scripted failure", type: "server_error" } }));
        return;
      }
      const path = req.url ?? "";
      const body$ = path.endsWith("/chat/completions")
        ? completions(reply)
        : path.endsWith("/messages")
          ? anthropic(reply, options.promptCache?.usage(body))
          : path.endsWith("/responses")
            ? responses(reply)
            : undefined;
      if (body$ === undefined) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      res.end(body$);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
