import type * as PiAgentCore from "@mariozechner/pi-agent-core";
import type * as PiAi from "@mariozechner/pi-ai";
import type { Api, Model } from "@mariozechner/pi-ai";
import { z } from "zod";
import { AgentConfigError } from "./errors.js";
import { SCRIPTED_API, type ScriptStep, ScriptStepSchema, streamScripted } from "./scripted.js";

/**
 * pi-agent-core and pi-ai cost about half a second and tens of MB to import (they bring several vendor
 * SDKs), so nothing loads them until a child turn actually runs.
 */
export interface PiModules {
  readonly ai: typeof PiAi;
  readonly core: typeof PiAgentCore;
}

let loading: Promise<PiModules> | undefined;
export function loadPi(): Promise<PiModules> {
  loading ??= Promise.all([import("@mariozechner/pi-ai"), import("@mariozechner/pi-agent-core")]).then(
    ([ai, core]) => ({ ai, core }),
  );
  return loading;
}

const common = {
  modelId: z.string().min(1).max(200),
  /** Where the server is. OpenAI APIs include `/v1`; Anthropic's base URL does not. */
  baseUrl: z.url().optional(),
  /** The key itself (discouraged), or the environment variable that holds it. A server that needs no key
   * still gets one sent: give it any placeholder. */
  apiKey: z.string().optional(),
  apiKeyEnv: z
    .string()
    .regex(/^[A-Z_][A-Z0-9_]*$/)
    .optional(),
  contextWindow: z.number().int().positive().optional(),
  maxTokens: z.number().int().positive().optional(),
  headers: z.record(z.string(), z.string()).optional(),
};

/**
 * How a child's model is reached, by API family, model id and base URL. Any server speaking one of these
 * wire protocols works by pointing `baseUrl` at it. `scripted` needs no network or account.
 */
export const ModelConfigSchema = z.discriminatedUnion("api", [
  z.strictObject({ api: z.literal("openai-responses"), ...common }),
  z.strictObject({ api: z.literal("openai-completions"), ...common }),
  z.strictObject({ api: z.literal("anthropic-messages"), ...common }),
  /** ChatGPT-account Codex Responses; the key is the account's access token (a JWT naming the account). */
  z.strictObject({ api: z.literal("openai-codex-responses"), ...common }),
  z.strictObject({
    api: z.literal("scripted"),
    modelId: z.string().min(1).max(200).default("scripted"),
    script: z.array(ScriptStepSchema).max(10_000).default([]),
  }),
]);
export type ModelConfig = z.input<typeof ModelConfigSchema>;
export type ResolvedModelConfig = z.output<typeof ModelConfigSchema>;

const DEFAULTS = {
  "openai-responses": { provider: "openai", baseUrl: "https://api.openai.com/v1", keyEnv: "OPENAI_API_KEY" },
  "openai-completions": {
    provider: "openai",
    baseUrl: "https://api.openai.com/v1",
    keyEnv: "OPENAI_API_KEY",
  },
  "anthropic-messages": {
    provider: "anthropic",
    baseUrl: "https://api.anthropic.com",
    keyEnv: "ANTHROPIC_API_KEY",
  },
  "openai-codex-responses": {
    provider: "openai-codex",
    baseUrl: "https://chatgpt.com/backend-api",
    keyEnv: "OPENAI_CODEX_ACCESS_TOKEN",
  },
} as const;

/**
 * The transport a configuration streams over. Codex Responses would try WebSockets first; on Node 20 it
 * must use SSE.
 */
export function transportFor(config: ResolvedModelConfig): "sse" | undefined {
  return config.api === "openai-codex-responses" ? "sse" : undefined;
}

export function parseModelConfig(raw: unknown): ResolvedModelConfig {
  const parsed = ModelConfigSchema.safeParse(raw);
  if (!parsed.success) {
    throw new AgentConfigError(
      "invalid_model_config",
      `model configuration is invalid: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
    );
  }
  return parsed.data;
}

/** A resolved model: what pi-ai streams with, plus how to get its key. */
export interface ResolvedModel {
  readonly model: Model<Api>;
  readonly config: ResolvedModelConfig;
  readonly apiKey: () => string | undefined;
  /** Where the key is looked up when the configuration does not carry it. */
  readonly apiKeyEnv?: string;
}

const scripts = new WeakMap<Model<Api>, readonly ScriptStep[]>();

/**
 * Builds the pi-ai model for a configuration. A model id pi-ai knows for that provider lends its metadata
 * (reasoning support, context window, prices); the configured base URL and limits always win.
 */
export async function resolveModel(raw: ModelConfig | ResolvedModelConfig): Promise<ResolvedModel> {
  const config = parseModelConfig(raw);
  if (config.api === "scripted") {
    const model: Model<Api> = {
      id: config.modelId,
      name: config.modelId,
      api: SCRIPTED_API,
      provider: "scripted",
      baseUrl: "offline:",
      reasoning: false,
      input: ["text"],
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
      contextWindow: 1_000_000,
      maxTokens: 100_000,
    };
    scripts.set(model, config.script);
    return { model, config, apiKey: () => undefined };
  }
  const { ai } = await loadPi();
  const defaults = DEFAULTS[config.api];
  const known = (ai.getModels(defaults.provider) as Model<Api>[]).find(
    (m) => m.id === config.modelId && m.api === config.api,
  );
  const model: Model<Api> = {
    id: config.modelId,
    name: known?.name ?? config.modelId,
    api: config.api,
    provider: defaults.provider,
    baseUrl: config.baseUrl ?? known?.baseUrl ?? defaults.baseUrl,
    reasoning: known?.reasoning ?? false,
    input: known?.input ?? ["text"],
    cost: known?.cost ?? { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
    contextWindow: config.contextWindow ?? known?.contextWindow ?? 128_000,
    maxTokens: config.maxTokens ?? known?.maxTokens ?? 16_384,
    ...(config.headers ? { headers: config.headers } : {}),
    ...(known?.thinkingLevelMap ? { thinkingLevelMap: known.thinkingLevelMap } : {}),
  };
  const keyEnv = config.apiKeyEnv ?? defaults.keyEnv;
  return { model, config, apiKey: () => config.apiKey ?? process.env[keyEnv], apiKeyEnv: keyEnv };
}

/** The stream function every child agent uses: the scripted provider in process, everything else via pi-ai. */
export function childStreamFn(pi: PiModules): PiAgentCore.StreamFn {
  return (model, context, options) => {
    const script = scripts.get(model as Model<Api>);
    if (model.api === SCRIPTED_API) {
      return streamScripted(
        pi.ai.createAssistantMessageEventStream,
        model as Model<string>,
        script ?? [],
        context,
        options,
      );
    }
    return pi.ai.streamSimple(model, context, options);
  };
}
