import type { AssistantMessage, ToolCallContent, ToolResultMessage, TranscriptMessage } from "@crw/db";
import { z } from "zod";
import type { SessionTurnRunner, TurnHost, TurnOutcome, TurnRequest } from "./turn.js";

/**
 * A deterministic, offline SessionTurnRunner for tests, benchmarks and crash drills. Its "model" reads the
 * transcript only, so a recovered session continues exactly where its journal stands:
 *
 * - the newest user message that is a script (`{"script": {...}}`) is the current plan;
 * - each assistant message with tool calls after it counts as one finished round; the next request emits
 *   the next round's calls, and after the last round the final `answer`;
 * - input after that answer (steers, delivered results) gets one `followUp` reply per turn;
 * - a plain text task gets `answer: <task>`.
 */
export const scriptSchema = z
  .object({
    rounds: z
      .array(
        z.array(z.object({ name: z.string().min(1), arguments: z.record(z.string(), z.unknown()) }).strict()),
      )
      .default([]),
    answer: z.string().default("done"),
    followUp: z.string().default("noted"),
    /** The provider fails on this request instead of answering (0-based, counted within the plan). */
    failAtRequest: z.number().int().nonnegative().optional(),
  })
  .strict();
export type Script = z.input<typeof scriptSchema>;

export function scriptTask(script: Script): string {
  return JSON.stringify({ script });
}

function parseScript(text: string): z.output<typeof scriptSchema> | undefined {
  if (!text.startsWith('{"script"')) return undefined;
  try {
    const raw = JSON.parse(text) as { script?: unknown };
    const parsed = scriptSchema.safeParse(raw.script);
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

const text = (t: string): AssistantMessage => ({
  role: "assistant",
  content: [{ type: "text", text: t }],
  stopReason: "stop",
});

/** The scripted model: the next assistant message for a context. Pure. */
export function scriptedTurnReply(
  sessionId: string,
  context: readonly TranscriptMessage[],
): AssistantMessage {
  let planAt = -1;
  for (let i = context.length - 1; i >= 0; i--) {
    const m = context[i];
    if (m?.role === "user" && parseScript(m.content)) {
      planAt = i;
      break;
    }
  }
  if (planAt < 0) {
    const lastUser = [...context].reverse().find((m) => m.role === "user");
    const answered = context.length > 0 && context[context.length - 1]?.role === "assistant";
    if (lastUser && !answered) return text(`answer: ${lastUser.content}`);
    return text("noted");
  }
  const script = parseScript((context[planAt] as { content: string }).content) as z.output<
    typeof scriptSchema
  >;
  const after = context.slice(planAt + 1);
  const requests = after.filter((m) => m.role === "assistant").length;
  if (script.failAtRequest === requests) {
    return { role: "assistant", content: [], stopReason: "error", errorMessage: "scripted provider failure" };
  }
  const rounds = after.filter(
    (m) => m.role === "assistant" && m.content.some((c) => c.type === "toolCall"),
  ).length;
  const finalAt = after.findIndex(
    (m) => m.role === "assistant" && !m.content.some((c) => c.type === "toolCall"),
  );
  if (finalAt < 0 && rounds < script.rounds.length) {
    const calls = script.rounds[rounds] ?? [];
    return {
      role: "assistant",
      content: calls.map(
        (c, i): ToolCallContent => ({
          type: "toolCall",
          id: `${sessionId.slice(0, 8)}-p${planAt}-r${rounds}-c${i}`,
          name: c.name,
          arguments: c.arguments,
        }),
      ),
      stopReason: "toolUse",
    };
  }
  if (finalAt < 0) return text(script.answer);
  const inputs = after.slice(finalAt + 1).filter((m) => m.role !== "assistant").length;
  return text(`${script.followUp} (${inputs})`);
}

export interface ScriptedRunnerOptions {
  /** Bound on provider requests per turn: a runaway script ends with an error, not a loop. */
  readonly maxRequests?: number;
}

export function createScriptedTurnRunner(options: ScriptedRunnerOptions = {}): SessionTurnRunner {
  const maxRequests = options.maxRequests ?? 64;
  return {
    async runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome> {
      const context = [...request.context];
      for (let i = 0; i < maxRequests; i++) {
        if (request.signal.aborted) return { stopReason: "aborted" };
        const reply = scriptedTurnReply(request.sessionId, context);
        await host.record(reply);
        context.push(reply);
        if (reply.stopReason === "error")
          return { stopReason: "error", errorMessage: reply.errorMessage ?? "error" };
        for (const c of reply.content)
          if (c.type === "text") host.progress({ type: "text", sessionId: request.sessionId, text: c.text });
        const calls = reply.content.filter((c): c is ToolCallContent => c.type === "toolCall");
        if (calls.length === 0) return { stopReason: "stop" };
        for (const call of calls) {
          await host.beforeToolCall(call);
          host.progress({
            type: "tool",
            sessionId: request.sessionId,
            toolName: call.name,
            toolCallId: call.id,
          });
          const tool = request.tools.find((t) => t.name === call.name);
          let result: ToolResultMessage;
          if (!tool) {
            result = {
              role: "toolResult",
              toolCallId: call.id,
              toolName: call.name,
              content: `unknown tool ${call.name}`,
              isError: true,
            };
          } else {
            try {
              const out = await tool.execute(call.arguments, {
                sessionId: request.sessionId,
                principalAccountId: request.principalAccountId,
                toolCallId: call.id,
                readOnly: request.readOnly,
                workDir: request.workDir,
                signal: request.signal,
                progress: (e) => host.progress(e),
              });
              result = {
                role: "toolResult",
                toolCallId: call.id,
                toolName: call.name,
                content: out.content,
                isError: out.isError ?? false,
                ...(out.details ? { details: out.details } : {}),
              };
            } catch (e) {
              const err = e instanceof Error ? e : new Error(String(e));
              const code = (err as { code?: unknown }).code;
              result = {
                role: "toolResult",
                toolCallId: call.id,
                toolName: call.name,
                content: `${typeof code === "string" ? `${code}: ` : ""}${err.message}`,
                isError: true,
              };
            }
          }
          await host.record(result);
          context.push(result);
        }
        context.push(...(await host.drainSteering()));
      }
      return { stopReason: "error", errorMessage: `more than ${maxRequests} provider requests in one turn` };
    },
  };
}
