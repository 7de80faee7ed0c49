import { type ModelReply, type ReadRequest, sse, textOf } from "./request.js";

/**
 * OpenAI Responses (`POST /v1/responses`). The request's `input` is a list of items: messages by role
 * (system/developer, user, assistant), `function_call`s and `function_call_output`s. The reply streams the
 * events the real API sends, each with its `sequence_number`: response.created, response.in_progress, then
 * per output item output_item.added, its content (a text part, or the call's arguments) and
 * output_item.done, and last response.completed with the whole response and its usage. pi-ai's client reads
 * a text only after content_part.added opened its part, so that event is not optional here.
 */
type Item = { type?: string; role?: string; content?: unknown; output?: unknown };

export const readResponses: ReadRequest = (body) => {
  const items: Item[] =
    typeof body.input === "string" ? [{ role: "user", content: body.input }] : ((body.input ?? []) as Item[]);
  const messages = items.filter((i) => i.type === undefined || i.type === "message");
  const system = [
    ...(typeof body.instructions === "string" ? [body.instructions] : []),
    ...messages.filter((m) => m.role === "system" || m.role === "developer").map((m) => textOf(m.content)),
  ];
  return {
    protocol: "openai-responses",
    model: String(body.model ?? ""),
    system: system.join("\n"),
    tools: ((body.tools ?? []) as { name?: string }[]).map((t) => t.name ?? ""),
    userTexts: messages.filter((m) => m.role === "user").map((m) => textOf(m.content)),
    // A function_call_output carries no error flag either: the agent loop's text says it.
    toolResults: items
      .filter((i) => i.type === "function_call_output")
      .map((i) => ({ text: textOf(i.output), isError: false })),
  };
};

const USAGE = {
  input_tokens: 20,
  input_tokens_details: { cached_tokens: 0 },
  output_tokens: 5,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: 25,
};

/** The output item of a reply, as output_item.done and response.completed carry it. */
function outputItem(reply: ModelReply, n: number) {
  if ("text" in reply)
    return {
      id: `msg_${n}`,
      type: "message",
      status: "completed",
      role: "assistant",
      content: [{ type: "output_text", text: reply.text, annotations: [] }],
    };
  return {
    id: `fc_${n}`,
    type: "function_call",
    status: "completed",
    call_id: `call_${n}`,
    name: reply.tool.name,
    ...(reply.tool.namespace !== undefined && { namespace: reply.tool.namespace }),
    arguments: JSON.stringify(reply.tool.arguments),
  };
}

/** The events between output_item.added and output_item.done: the text part, or the call's arguments. */
function itemEvents(reply: ModelReply, n: number): Record<string, unknown>[] {
  const at = { output_index: 0 };
  if ("text" in reply) {
    const part = { type: "output_text", text: reply.text, annotations: [] };
    const inPart = { item_id: `msg_${n}`, ...at, content_index: 0 };
    return [
      { type: "response.content_part.added", ...inPart, part: { ...part, text: "" } },
      { type: "response.output_text.delta", ...inPart, delta: reply.text },
      { type: "response.output_text.done", ...inPart, text: reply.text },
      { type: "response.content_part.done", ...inPart, part },
    ];
  }
  const args = JSON.stringify(reply.tool.arguments);
  return [
    { type: "response.function_call_arguments.delta", item_id: `fc_${n}`, ...at, delta: args },
    { type: "response.function_call_arguments.done", item_id: `fc_${n}`, ...at, arguments: args },
  ];
}

export function responsesStream(reply: ModelReply, n: number): string {
  const done = outputItem(reply, n);
  const added =
    "text" in reply
      ? { ...done, status: "in_progress", content: [] }
      : { ...done, status: "in_progress", arguments: "" };
  const response = (status: string, output: unknown[], usage: unknown) => ({
    id: `resp_${n}`,
    object: "response",
    created_at: 0,
    status,
    model: "loopback",
    output,
    usage,
    error: null,
    incomplete_details: null,
  });
  const events: Record<string, unknown>[] = [
    { type: "response.created", response: response("in_progress", [], null) },
    { type: "response.in_progress", response: response("in_progress", [], null) },
    { type: "response.output_item.added", output_index: 0, item: added },
    ...itemEvents(reply, n),
    { type: "response.output_item.done", output_index: 0, item: done },
    { type: "response.completed", response: response("completed", [done], USAGE) },
  ];
  return sse(events.map((e, i) => ({ event: String(e.type), data: { ...e, sequence_number: i } })));
}
