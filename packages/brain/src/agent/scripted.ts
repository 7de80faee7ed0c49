import type {
  AssistantMessage,
  AssistantMessageEventStream,
  Context,
  Model,
  SimpleStreamOptions,
} from "@mariozechner/pi-ai";
import { z } from "zod";

/**
 * The built-in offline `scripted` provider: deterministic replies and tool calls with zero latency, for
 * offline runs, tests and benchmarks. A script is data (it crosses into a runner process unchanged). The
 * reply to a request is chosen by the number of assistant messages already in the request's context, so a
 * resumed or recovered session gets the same next reply a fresh run would; past the end of the script the
 * model answers `Done: <last input line>`. In `text`, `{{last}}` is replaced by the last input's text.
 *
 * With no configured script, a session can carry its own: the newest user message that is exactly
 * `{"steps": [...]}` (or whose first line is) is the script, counted from that message on. The task is journaled, so a recovered
 * session continues the same script, and a delegated child gets its script from its task.
 */
export const ScriptStepSchema = z.strictObject({
  text: z.string().optional(),
  toolCalls: z
    .array(
      z.strictObject({
        name: z.string().min(1).max(200),
        arguments: z.record(z.string(), z.unknown()).default({}),
        id: z.string().min(1).max(200).optional(),
      }),
    )
    .optional(),
  stopReason: z.enum(["stop", "length", "toolUse", "error", "aborted"]).optional(),
  errorMessage: z.string().optional(),
});
export type ScriptStep = z.input<typeof ScriptStepSchema>;

export const SCRIPTED_API = "crw-scripted";

function inputText(message: Context["messages"][number] | undefined): string {
  if (!message) return "";
  if (message.role === "assistant") return "";
  const content = message.content;
  if (typeof content === "string") return content;
  return content.map((part) => (part.type === "text" ? part.text : "")).join("");
}

function lastInputText(context: Context): string {
  for (let i = context.messages.length - 1; i >= 0; i--) {
    const message = context.messages[i];
    if (message?.role === "user") return inputText(message);
  }
  return "";
}

const tokens = (chars: number) => Math.ceil(chars / 4);

const TranscriptScriptSchema = z.strictObject({ steps: z.array(ScriptStepSchema) });

/** The newest `{"steps": [...]}` user message and the messages after it, if there is one. */
function transcriptScript(context: Context): { steps: ScriptStep[]; after: Context["messages"] } | undefined {
  for (let i = context.messages.length - 1; i >= 0; i--) {
    const message = context.messages[i];
    if (message?.role !== "user") continue;
    const text = inputText(message);
    if (!text.startsWith('{"steps"')) continue;
    // The whole message, else its first line: a workflow node's prompt appends its dependencies' handovers
    // after the task.
    for (const candidate of [text, text.split("\n", 1)[0] ?? ""]) {
      try {
        const parsed = TranscriptScriptSchema.safeParse(JSON.parse(candidate));
        if (parsed.success) return { steps: parsed.data.steps, after: context.messages.slice(i + 1) };
      } catch {
        // Not JSON after all: an ordinary task.
      }
    }
  }
  return undefined;
}

/** The reply the script gives to `context`. Pure: the same context always gets the same message. */
export function scriptedReply(
  model: Model<string>,
  script: readonly ScriptStep[],
  context: Context,
): AssistantMessage {
  const own = script.length === 0 ? transcriptScript(context) : undefined;
  const steps = own?.steps ?? script;
  const index = (own?.after ?? context.messages).filter((m) => m.role === "assistant").length;
  const last = lastInputText(context);
  const raw = steps[index] ?? { text: `Done: ${last.split("\n", 1)[0]?.slice(0, 200) ?? ""}` };
  const step = ScriptStepSchema.parse(raw);
  // Tool call ids are numbered by the reply's place in the whole transcript, not in its script, so two
  // prompts of one session never reuse an id (Delegate is idempotent per tool call id) and a replay of
  // the same transcript still gets the same ids.
  const position = context.messages.filter((m) => m.role === "assistant").length;
  const content: AssistantMessage["content"] = [];
  if (step.text !== undefined) content.push({ type: "text", text: step.text.replaceAll("{{last}}", last) });
  for (const [k, call] of (step.toolCalls ?? []).entries()) {
    content.push({
      type: "toolCall",
      id: call.id ?? `call_${position}_${k}`,
      name: call.name,
      arguments: call.arguments,
    });
  }
  const stopReason = step.stopReason ?? (step.toolCalls?.length ? "toolUse" : "stop");
  const promptChars = (context.systemPrompt?.length ?? 0) + JSON.stringify(context.messages).length;
  const outputChars = JSON.stringify(content).length;
  return {
    role: "assistant",
    content,
    api: model.api,
    provider: model.provider,
    model: model.id,
    usage: {
      input: tokens(promptChars),
      output: tokens(outputChars),
      cacheRead: 0,
      cacheWrite: 0,
      totalTokens: tokens(promptChars) + tokens(outputChars),
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
    },
    stopReason,
    ...(step.errorMessage !== undefined || stopReason === "error"
      ? { errorMessage: step.errorMessage ?? "scripted error" }
      : {}),
    timestamp: 0,
  };
}

/** Streams a scripted reply through pi-ai's real event protocol (start, deltas, done|error). */
export function streamScripted(
  createStream: () => AssistantMessageEventStream,
  model: Model<string>,
  script: readonly ScriptStep[],
  context: Context,
  options?: SimpleStreamOptions,
): AssistantMessageEventStream {
  const stream = createStream();
  let message: AssistantMessage;
  try {
    message = scriptedReply(model, script, context);
  } catch (e) {
    message = {
      ...scriptedReply(model, [{ text: "" }], context),
      content: [],
      stopReason: "error",
      errorMessage: `invalid script step: ${e instanceof Error ? e.message : String(e)}`,
    };
  }
  if (options?.signal?.aborted)
    message = { ...message, content: [], stopReason: "aborted", errorMessage: "Request was aborted" };
  if (message.stopReason === "error" || message.stopReason === "aborted") {
    stream.push({ type: "error", reason: message.stopReason, error: message });
    stream.end(message);
    return stream;
  }
  const partial: AssistantMessage = { ...message, content: [] };
  stream.push({ type: "start", partial: { ...partial } });
  for (const [i, block] of message.content.entries()) {
    partial.content = [...partial.content, block];
    if (block.type === "text") {
      stream.push({ type: "text_start", contentIndex: i, partial: { ...partial } });
      stream.push({ type: "text_delta", contentIndex: i, delta: block.text, partial: { ...partial } });
      stream.push({ type: "text_end", contentIndex: i, content: block.text, partial: { ...partial } });
    } else if (block.type === "toolCall") {
      stream.push({ type: "toolcall_start", contentIndex: i, partial: { ...partial } });
      stream.push({ type: "toolcall_end", contentIndex: i, toolCall: block, partial: { ...partial } });
    }
  }
  stream.push({ type: "done", reason: message.stopReason as "stop" | "length" | "toolUse", message });
  stream.end(message);
  return stream;
}
