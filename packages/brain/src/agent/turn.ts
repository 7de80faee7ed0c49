import {
  type ProviderUsage,
  providerUsageSchema,
  type ResultDetails,
  resultDetailsSchema,
  type TranscriptMessage,
  transcriptMessageSchema,
} from "@crw/db";
import type { AgentEvent, AgentMessage, AgentTool } from "@mariozechner/pi-agent-core";
import type { Message, AssistantMessage as PiAssistant, TSchema } from "@mariozechner/pi-ai";
import { z } from "zod";
import { type DelegatedExecutionScope, parseDelegatedExecutionScope } from "../scope/index.js";
import { assistantText, fromPiMessage, toPiMessage } from "./convert.js";
import { AgentConfigError, type ErrorData, errorData, toError } from "./errors.js";
import { childStreamFn, loadPi, type ModelConfig, resolveModel, transportFor } from "./providers.js";
import { CHILD_TOOL_NAMES, type ChildToolOptions, checkChildToolCall, createChildTools } from "./tools.js";

/** Written (awaited) before a permitted tool call runs: the intent is durable before the effect. */
export interface ToolIntent {
  readonly toolCallId: string;
  readonly toolName: string;
  readonly arguments: Record<string, unknown>;
}

export type ChildTurnProgress =
  | { readonly type: "text"; readonly delta: string }
  | { readonly type: "tool_start"; readonly toolCallId: string; readonly toolName: string }
  | {
      readonly type: "tool_end";
      readonly toolCallId: string;
      readonly toolName: string;
      readonly isError: boolean;
    }
  | { readonly type: "provider_request"; readonly index: number };

/**
 * What a host plugs into a turn. Every hook is awaited in order, so a slow hook slows the turn (by design:
 * persistence must finish before the next step). A throwing `onToolIntent` blocks that call; a throwing
 * `onMessage` ends the turn with `stopReason: "error"`.
 */
export interface ChildTurnHooks {
  readonly onToolIntent?: (intent: ToolIntent) => Promise<void> | void;
  /**
   * Every message the turn adds, in order: its input, replies, tool results, injected steering. An
   * assistant message a provider produced comes with that response's usage (`meta.usage`); the offline
   * scripted provider and a request refused before it reached a provider report none.
   */
  readonly onMessage?: (
    message: TranscriptMessage,
    meta?: { readonly usage?: ProviderUsage },
  ) => Promise<void> | void;
  readonly onProgress?: (event: ChildTurnProgress) => void;
  /**
   * Polled after each tool round and before the next provider request; everything returned goes into the
   * transcript in FIFO order before that request (pi's steering queue in "all" mode).
   */
  readonly drainSteering?: () => Promise<readonly TranscriptMessage[]> | readonly TranscriptMessage[];
}

/**
 * A tool the host adds to the child's own set (Delegate and friends for nested delegation). The host
 * applies its own scope rules inside `execute`; the loop still records its intent before it runs.
 */
export interface HostTool {
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments. */
  readonly parameters: Readonly<Record<string, unknown>>;
  execute(
    args: Record<string, unknown>,
    call: { readonly toolCallId: string; readonly signal: AbortSignal | undefined },
  ): Promise<{ readonly content: string; readonly isError?: boolean; readonly details?: ResultDetails }>;
}

/** One child turn: everything it needs is in the input, so the same turn can run in another process. */
export interface ChildTurnInput {
  readonly sessionId: string;
  readonly systemPrompt: string;
  /** The settled transcript before this turn. */
  readonly messages: readonly TranscriptMessage[];
  /** New input (a task, a follow-up, delivered results). Absent: continue from the transcript's last input. */
  readonly input?: string | readonly TranscriptMessage[];
  /** The durable scope, canonical JSON or parsed. */
  readonly scope: string | DelegatedExecutionScope;
  /** Absolute path where the child's tools run (the scope's replayed workDir). */
  readonly workDir: string;
  readonly model: ModelConfig;
  /** The per-call read-only clamp (`read_only_scope` of the open call). */
  readonly readOnly?: boolean;
  readonly signal?: AbortSignal;
  readonly hooks?: ChildTurnHooks;
  /** Host tools beside the child tools; a host tool wins a name clash. */
  readonly hostTools?: readonly HostTool[];
  /** Whether the child gets read/write/edit/shell in its workDir. Default true. */
  readonly childTools?: boolean;
  readonly limits?: {
    /** Provider requests one turn may make before it is stopped with an error. Default 100. */
    readonly maxProviderCalls?: number;
    readonly shellTimeoutMs?: number;
    readonly maxOutputBytes?: number;
  };
}

export interface ToolCallRecord {
  readonly toolCallId: string;
  readonly toolName: string;
  readonly arguments: Record<string, unknown>;
  readonly isError: boolean;
  readonly result: string;
  /** Set when the call never ran: refused by scope, or its intent could not be recorded. */
  readonly refused?: ErrorData;
}

export interface TurnUsage {
  readonly providerCalls: number;
  readonly input: number;
  readonly output: number;
  readonly cacheRead: number;
  readonly cacheWrite: number;
  readonly totalTokens: number;
  readonly cost: number;
}

export type ChildTurnStopReason = "stop" | "length" | "toolUse" | "error" | "aborted";

export interface ChildTurnOutcome {
  /** Everything the turn added, in transcript order: its input, injected steering, replies, tool results. */
  readonly messages: TranscriptMessage[];
  readonly stopReason: ChildTurnStopReason;
  readonly errorMessage?: string;
  /** The final assistant message's text, whitespace kept. */
  readonly finalText: string;
  readonly toolCalls: ToolCallRecord[];
  readonly usage: TurnUsage;
}

const whole = (n: unknown) => (typeof n === "number" && Number.isFinite(n) && n > 0 ? Math.round(n) : 0);

/**
 * The usage one provider response reported, in the journal's shape. `cost` only when the model has prices
 * (pi-ai computes it from them; a model without prices would always report 0). Undefined when the message
 * has no usage or a figure does not validate.
 */
export function providerUsageOf(
  message: PiAssistant,
  model: { readonly cost: { readonly input: number; readonly output: number } },
): ProviderUsage | undefined {
  const u = message.usage as Partial<PiAssistant["usage"]> | undefined;
  if (!u) return undefined;
  const priced = model.cost.input > 0 || model.cost.output > 0;
  const parsed = providerUsageSchema.safeParse({
    api: message.api || "unknown",
    provider: message.provider || "unknown",
    model: message.model || "unknown",
    stopReason: message.stopReason || "unknown",
    input: whole(u.input),
    output: whole(u.output),
    cacheRead: whole(u.cacheRead),
    cacheWrite: whole(u.cacheWrite),
    totalTokens: whole(u.totalTokens),
    ...(priced ? { cost: Math.max(0, Number(u.cost?.total ?? 0) || 0) } : {}),
  });
  return parsed.success ? parsed.data : undefined;
}

const InputShape = z.object({
  sessionId: z.string().min(1).max(200),
  systemPrompt: z.string(),
  messages: z.array(transcriptMessageSchema),
  input: z.union([z.string().min(1), z.array(transcriptMessageSchema).min(1)]).optional(),
  workDir: z.string().startsWith("/"),
  readOnly: z.boolean().optional(),
});

function invalid(message: string): never {
  throw new AgentConfigError("invalid_turn_input", message);
}

/**
 * Runs one child turn on pi-agent-core with `steeringMode: "all"` and returns its outcome. Provider
 * failures and aborts are outcomes (`stopReason` "error"/"aborted"), checked after the prompt returns;
 * only invalid input (a malformed transcript, scope or model configuration) throws, before anything runs.
 */
export async function runChildTurn(input: ChildTurnInput): Promise<ChildTurnOutcome> {
  const shape = InputShape.safeParse(input);
  if (!shape.success)
    invalid(
      `child turn input is invalid: ${shape.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
    );
  const scope = parseDelegatedExecutionScope(input.scope);
  const last = input.messages.at(-1);
  if (input.input === undefined && (last === undefined || last.role === "assistant")) {
    invalid("nothing to continue: the transcript does not end with an input and no input was given");
  }
  const resolved = await resolveModel(input.model);
  if (resolved.config.api !== "scripted" && !resolved.apiKey()) {
    throw new AgentConfigError(
      "missing_api_key",
      `no API key for ${resolved.config.api}: set ${resolved.apiKeyEnv} or the configuration's apiKey`,
      {
        api: resolved.config.api,
        env: resolved.apiKeyEnv,
      },
    );
  }
  const pi = await loadPi();

  const toolOptions: ChildToolOptions = {
    workDir: input.workDir,
    scope,
    ...(input.readOnly !== undefined ? { readOnly: input.readOnly } : {}),
    ...(input.limits?.shellTimeoutMs !== undefined ? { shellTimeoutMs: input.limits.shellTimeoutMs } : {}),
    ...(input.limits?.maxOutputBytes !== undefined ? { maxOutputBytes: input.limits.maxOutputBytes } : {}),
  };
  const hostTools = input.hostTools ?? [];
  const hostNames = new Set(hostTools.map((t) => t.name));
  const resultDetails = new Map<string, ResultDetails>();
  const tools: AgentTool[] = [
    ...(input.childTools === false
      ? []
      : createChildTools(toolOptions).filter((t) => !hostNames.has(t.name))),
    ...hostTools.map(
      (tool): AgentTool => ({
        name: tool.name,
        label: tool.name,
        description: tool.description,
        parameters: tool.parameters as unknown as TSchema,
        executionMode: "sequential",
        execute: async (toolCallId, params, signal) => {
          const out = await tool.execute(params as Record<string, unknown>, { toolCallId, signal });
          const details = out.details === undefined ? undefined : resultDetailsSchema.parse(out.details);
          if (details) resultDetails.set(toolCallId, details);
          if (out.isError) throw new Error(out.content);
          return { content: [{ type: "text", text: out.content }], details: details ?? {} };
        },
      }),
    ),
  ];
  const customs = new Map<object, TranscriptMessage>();
  const toPi = (m: TranscriptMessage): Message => {
    const converted = toPiMessage(m, resolved.model);
    if (m.role === "custom") customs.set(converted, m);
    return converted;
  };
  const hooks = input.hooks ?? {};
  const refusals = new Map<string, ErrorData>();
  const toolArgs = new Map<string, Record<string, unknown>>();

  const stream = childStreamFn(pi);
  const maxProviderCalls = input.limits?.maxProviderCalls ?? 100;
  let providerCalls = 0;
  let overLimit = false;
  // Messages no provider produced (a request refused by the bound): they carry no usage.
  const synthetic = new WeakSet<object>();

  const agent = new pi.core.Agent({
    initialState: {
      systemPrompt: input.systemPrompt,
      model: resolved.model,
      tools,
      messages: input.messages.map(toPi),
    },
    streamFn: (model, context, options) => {
      // The bound is enforced before the request: the refused one never reaches the provider.
      if (providerCalls >= maxProviderCalls) {
        overLimit = true;
        const stream = pi.ai.createAssistantMessageEventStream();
        const failure: PiAssistant = {
          role: "assistant",
          content: [],
          api: model.api,
          provider: model.provider,
          model: model.id,
          usage: {
            input: 0,
            output: 0,
            cacheRead: 0,
            cacheWrite: 0,
            totalTokens: 0,
            cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
          },
          stopReason: "error",
          errorMessage: `the turn reached its limit of ${maxProviderCalls} provider requests`,
          timestamp: Date.now(),
        };
        synthetic.add(failure);
        stream.push({ type: "error", reason: "error", error: failure });
        stream.end(failure);
        return stream;
      }
      providerCalls++;
      hooks.onProgress?.({ type: "provider_request", index: providerCalls });
      return stream(model, context, options);
    },
    getApiKey: () => resolved.apiKey(),
    steeringMode: "all",
    followUpMode: "all",
    ...(transportFor(resolved.config) ? { transport: transportFor(resolved.config) } : {}),
    toolExecution: "sequential",
    sessionId: input.sessionId,
    beforeToolCall: async ({ toolCall, args }) => {
      try {
        if (!hostNames.has(toolCall.name))
          checkChildToolCall(toolOptions, toolCall.name, args as Record<string, unknown>);
      } catch (e) {
        refusals.set(toolCall.id, errorData(e));
        return { block: true, reason: toError(e).message };
      }
      try {
        await hooks.onToolIntent?.({
          toolCallId: toolCall.id,
          toolName: toolCall.name,
          arguments: toolCall.arguments,
        });
      } catch (e) {
        refusals.set(toolCall.id, errorData(e));
        return {
          block: true,
          reason: `tool call not started: its intent could not be recorded (${toError(e).message})`,
        };
      }
      return undefined;
    },
  });

  const catalogRefusal = (name: string, args: Record<string, unknown>): ErrorData => {
    const unknown = { name: "ToolCallRefusedError", code: "unknown_tool", message: `no tool named ${name}` };
    if (input.childTools === false || !(CHILD_TOOL_NAMES as readonly string[]).includes(name)) return unknown;
    try {
      checkChildToolCall(toolOptions, name, args);
    } catch (e) {
      return errorData(e);
    }
    return unknown;
  };

  const outcomeMessages: TranscriptMessage[] = [];
  const seen = new Set<AgentMessage>();
  const toolCalls: ToolCallRecord[] = [];
  agent.subscribe(async (event: AgentEvent) => {
    switch (event.type) {
      case "agent_start":
        // The run exists only now; an abort requested before it is applied here.
        if (input.signal?.aborted) agent.abort();
        return;
      case "message_update":
        if (event.assistantMessageEvent.type === "text_delta")
          hooks.onProgress?.({ type: "text", delta: event.assistantMessageEvent.delta });
        return;
      case "message_end": {
        seen.add(event.message);
        let journal = customs.get(event.message) ?? fromPiMessage(event.message);
        if (!journal) return;
        if (journal.role === "toolResult") {
          const details = resultDetails.get(journal.toolCallId);
          if (details) journal = { ...journal, details };
        }
        outcomeMessages.push(journal);
        const usage =
          journal.role === "assistant" && !synthetic.has(event.message) && resolved.config.api !== "scripted"
            ? providerUsageOf(event.message as PiAssistant, resolved.model)
            : undefined;
        await hooks.onMessage?.(journal, usage ? { usage } : undefined);
        return;
      }
      case "tool_execution_start":
        toolArgs.set(event.toolCallId, event.args);
        hooks.onProgress?.({ type: "tool_start", toolCallId: event.toolCallId, toolName: event.toolName });
        return;
      case "tool_execution_end": {
        const result = event.result as { content?: { type: string; text?: string }[] } | undefined;
        const text = (result?.content ?? []).map((p) => (p.type === "text" ? (p.text ?? "") : "")).join("");
        let refused = refusals.get(event.toolCallId);
        if (
          !refused &&
          event.isError &&
          !tools.some((t) => t.name === event.toolName) &&
          !hostNames.has(event.toolName)
        ) {
          // Not in the catalog the model was shown: say why in the scope's terms.
          refused = catalogRefusal(event.toolName, toolArgs.get(event.toolCallId) ?? {});
        }
        toolCalls.push({
          toolCallId: event.toolCallId,
          toolName: event.toolName,
          arguments: toolArgs.get(event.toolCallId) ?? {},
          isError: event.isError,
          result: text,
          ...(refused ? { refused } : {}),
        });
        hooks.onProgress?.({
          type: "tool_end",
          toolCallId: event.toolCallId,
          toolName: event.toolName,
          isError: event.isError,
        });
        return;
      }
      case "turn_end": {
        // Delivery point: after a tool round, before the next provider request. An answer without tool
        // calls ends the turn; what arrives then belongs to the host's idle path.
        if (event.toolResults.length === 0) return;
        const steering = (await hooks.drainSteering?.()) ?? [];
        for (const message of steering) agent.steer(toPi(transcriptMessageSchema.parse(message)));
        return;
      }
      default:
        return;
    }
  });

  const abort = () => agent.abort();
  input.signal?.addEventListener("abort", abort, { once: true });
  try {
    if (input.input === undefined) await agent.continue();
    else {
      const fresh: TranscriptMessage[] =
        typeof input.input === "string" ? [{ role: "user", content: input.input }] : [...input.input];
      await agent.prompt(fresh.map(toPi));
    }
  } finally {
    input.signal?.removeEventListener("abort", abort);
  }

  // A run that failed outside the provider (a hook threw) ends with a failure message no message_end announced.
  const finalPi = [...agent.state.messages]
    .reverse()
    .find((m): m is PiAssistant => (m as Message).role === "assistant");
  if (finalPi && !seen.has(finalPi)) {
    const journal = fromPiMessage(finalPi);
    if (journal) outcomeMessages.push(journal);
  }
  const finalMessage = [...outcomeMessages].reverse().find((m) => m.role === "assistant");
  let stopReason: ChildTurnStopReason = finalPi?.stopReason ?? "error";
  let errorMessage = finalPi?.errorMessage ?? agent.state.errorMessage;
  if (overLimit) {
    stopReason = "error";
    errorMessage = `the turn reached its limit of ${maxProviderCalls} provider requests`;
  }
  const usage = { providerCalls, input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: 0 };
  for (const m of agent.state.messages.slice(input.messages.length)) {
    if ((m as Message).role !== "assistant") continue;
    const u = (m as PiAssistant).usage;
    usage.input += u.input;
    usage.output += u.output;
    usage.cacheRead += u.cacheRead;
    usage.cacheWrite += u.cacheWrite;
    usage.totalTokens += u.totalTokens;
    usage.cost += u.cost.total;
  }
  return {
    messages: outcomeMessages,
    stopReason,
    ...(errorMessage !== undefined && (stopReason === "error" || stopReason === "aborted")
      ? { errorMessage }
      : {}),
    finalText: assistantText(finalMessage),
    toolCalls,
    usage,
  };
}
