import { randomUUID } from "node:crypto";
import type { ProviderUsage } from "@crw/db";
import {
  addUsage,
  type SessionTurnRunner,
  type TurnHost,
  type TurnOutcome,
  type TurnRequest,
  type TurnUsageTotals,
} from "../delegation/turn.js";
import { captureDelegatedExecutionScope } from "../scope/index.js";
import { AgentConfigError } from "./errors.js";
import type { ModelConfig } from "./providers.js";
import type { ScriptStep } from "./scripted.js";
import { type HostTool, runChildTurn } from "./turn.js";

type ProviderApi =
  | "openai-responses"
  | "openai-completions"
  | "anthropic-messages"
  | "openai-codex-responses";

/**
 * How a session's model name becomes a provider configuration. Names are `<api>:<model id>` (for example
 * `anthropic-messages:claude-sonnet-4-5`), `scripted` or `scripted:<script name>`. A base URL per API
 * points a family at any compatible server.
 */
export interface ModelCatalogOptions {
  readonly baseUrls?: Partial<Record<ProviderApi, string>>;
  readonly apiKeyEnv?: Partial<Record<ProviderApi, string>>;
  /** Named scripts for `scripted:<name>`. */
  readonly scripts?: Readonly<Record<string, readonly ScriptStep[]>>;
}

export function modelConfigFor(name: string, catalog: ModelCatalogOptions = {}): ModelConfig {
  if (name === "scripted") return { api: "scripted" };
  const colon = name.indexOf(":");
  const api = colon < 0 ? name : name.slice(0, colon);
  const id = colon < 0 ? "" : name.slice(colon + 1);
  if (api === "scripted") {
    const script = catalog.scripts?.[id];
    if (!script) throw new AgentConfigError("invalid_model_config", `no script named ${id}`, { model: name });
    return { api: "scripted", modelId: `scripted:${id}`, script: [...script] };
  }
  if (
    api === "openai-responses" ||
    api === "openai-completions" ||
    api === "anthropic-messages" ||
    api === "openai-codex-responses"
  ) {
    if (!id)
      throw new AgentConfigError("invalid_model_config", `model ${name} names no model id`, { model: name });
    const baseUrl = catalog.baseUrls?.[api];
    const apiKeyEnv = catalog.apiKeyEnv?.[api];
    return { api, modelId: id, ...(baseUrl ? { baseUrl } : {}), ...(apiKeyEnv ? { apiKeyEnv } : {}) };
  }
  throw new AgentConfigError("invalid_model_config", `unknown model API in ${name}`, { model: name });
}

/**
 * One provider response's usage in an in-process turn, as the runner pool's `attachProviderUsageSink` reports
 * a runner turn's (`{ runnerId, sessionId, turnId, usage }` without the runner): `turnId` is fresh for each
 * `runTurn`.
 */
export interface ProviderUsageReport {
  readonly sessionId: string;
  readonly principalAccountId: string;
  readonly turnId: string;
  readonly usage: ProviderUsage;
}

export interface AgentTurnRunnerOptions extends ModelCatalogOptions {
  /** Overrides the name-to-configuration mapping. */
  readonly models?: (name: string) => ModelConfig;
  readonly maxProviderCalls?: number;
  readonly shellTimeoutMs?: number;
  /**
   * Called once per provider response that reported usage, after the response's assistant row was handed
   * to the host (journaled with the same usage). A hook that throws is ignored: accounting never ends a turn.
   */
  readonly onProviderUsage?: (report: ProviderUsageReport) => void;
}

/**
 * The delegation core's `SessionTurnRunner` on the real agent loop: the request's context is the transcript
 * (ending with the turn's input), the host's tools join the child tools, and every message, tool intent,
 * steering drain and progress event goes through the `TurnHost` in the order the seam's contract states.
 * Failures of the provider or of the host's journal come back as the outcome, never thrown.
 */
export function createAgentTurnRunner(options: AgentTurnRunnerOptions = {}): SessionTurnRunner {
  return {
    async runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome> {
      let model: ModelConfig;
      try {
        model = options.models ? options.models(request.model) : modelConfigFor(request.model, options);
      } catch (e) {
        return { stopReason: "error", errorMessage: e instanceof Error ? e.message : String(e) };
      }
      const hostTools: HostTool[] = request.tools.map((tool) => ({
        name: tool.name,
        description: tool.description,
        parameters: tool.parameters,
        execute: (args, call) =>
          tool.execute(args, {
            sessionId: request.sessionId,
            principalAccountId: request.principalAccountId,
            toolCallId: call.toolCallId,
            readOnly: request.readOnly,
            workDir: request.workDir,
            signal: call.signal ?? request.signal,
            progress: (event) => host.progress(event),
          }),
      }));
      // A root session has no durable scope: its own tools run under an unrestricted scope of its account.
      const turnId = randomUUID();
      let usage: TurnUsageTotals | undefined;
      const scope =
        request.scope ??
        captureDelegatedExecutionScope({
          accountId: request.principalAccountId,
          target: { kind: "host", ref: null },
        });
      const outcome = await runChildTurn({
        sessionId: request.sessionId,
        systemPrompt: request.systemPrompt,
        messages: request.context,
        scope,
        workDir: request.workDir ?? "/",
        // Child tools act on this host's files: a managed guest or a paired computer gets its tools elsewhere.
        childTools: request.workDir !== null && (request.scope?.target.kind ?? "host") === "host",
        model,
        readOnly: request.readOnly,
        signal: request.signal,
        hostTools,
        limits: {
          ...(options.maxProviderCalls !== undefined ? { maxProviderCalls: options.maxProviderCalls } : {}),
          ...(options.shellTimeoutMs !== undefined ? { shellTimeoutMs: options.shellTimeoutMs } : {}),
        },
        hooks: {
          onMessage: async (message, meta) => {
            if (message.role === "toolResult") await host.record(message);
            if (message.role !== "assistant") return;
            const reported = meta?.usage;
            await host.record(message, reported ? { usage: reported } : undefined);
            if (!reported) return;
            usage = addUsage(usage, reported);
            try {
              options.onProviderUsage?.({
                sessionId: request.sessionId,
                principalAccountId: request.principalAccountId,
                turnId,
                usage: reported,
              });
            } catch {
              // The report is accounting; the turn goes on.
            }
          },
          onToolIntent: (intent) =>
            host.beforeToolCall({
              type: "toolCall",
              id: intent.toolCallId,
              name: intent.toolName,
              arguments: intent.arguments,
            }),
          drainSteering: () => host.drainSteering(),
          onProgress: (event) => {
            if (event.type === "text")
              host.progress({ type: "text", sessionId: request.sessionId, text: event.delta });
            else if (event.type === "tool_start")
              host.progress({
                type: "tool",
                sessionId: request.sessionId,
                toolName: event.toolName,
                toolCallId: event.toolCallId,
              });
          },
        },
      }).catch((e: unknown) => ({
        stopReason: "error" as const,
        errorMessage: e instanceof Error ? e.message : String(e),
      }));
      const stopReason =
        outcome.stopReason === "error" || outcome.stopReason === "aborted" ? outcome.stopReason : "stop";
      return {
        stopReason,
        ...(outcome.errorMessage !== undefined ? { errorMessage: outcome.errorMessage } : {}),
        ...(usage ? { usage } : {}),
      };
    },
  };
}
