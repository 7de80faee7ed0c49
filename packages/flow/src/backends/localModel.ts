import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type * as Brain from "@crw/brain";
import { z } from "zod";
import { isHttpUrl, KEY_ENV_NAME, type LocalSpec } from "../run/spec.js";
import { FlowError } from "../util/errors.js";

/**
 * Which model a local run talks to and where: the daemon's provider configuration, taken the same way.
 * `--model` / `--model-base-url` / `--model-api-key-env` beat `CRW_MODEL` / `CRW_MODEL_BASE_URL` /
 * `CRW_MODEL_API_KEY_ENV`, which beat the config file's `models` section (`--config FILE`, else
 * `$CRW_FLOW_CONFIG`, else `<state dir>/config.json` when it exists), the daemon's shape:
 * `{ "models": { "default", "baseUrls": { <api>: url }, "apiKeyEnv": { <api>: VAR } } }`. The start resolves
 * it once into the spec's `local` (see LocalSpec); the run's process builds brain's ModelConfig from that.
 */
export const LOCAL_APIS = [
  "openai-responses",
  "openai-completions",
  "anthropic-messages",
  "openai-codex-responses",
] as const;
export type LocalApi = (typeof LOCAL_APIS)[number];

const api = z.enum(LOCAL_APIS);
const configSchema = z
  .strictObject({
    models: z
      .strictObject({
        default: z.string().min(1).max(256),
        baseUrls: z.partialRecord(api, z.string().refine(isHttpUrl, "not an http(s) URL")),
        apiKeyEnv: z.partialRecord(api, z.string().regex(KEY_ENV_NAME, "not an environment variable name")),
      })
      .partial(),
  })
  .partial();
type FlowConfig = z.infer<typeof configSchema>;

/** What the start was given for the local backend's model; unset members fall back to env, then the file. */
export interface LocalModelOptions {
  model?: string | undefined;
  script?: string | undefined;
  baseUrl?: string | undefined;
  apiKeyEnv?: string | undefined;
  config?: string | undefined;
  /** The state directory, whose `config.json` is the file of last resort. */
  state: string;
  env: NodeJS.ProcessEnv;
}

const input = (message: string): never => {
  throw new FlowError("input", message, 2);
};

/** The config file named by `--config` or `$CRW_FLOW_CONFIG` (must exist), else the state's, if present. */
export function readFlowConfig(o: Pick<LocalModelOptions, "config" | "state" | "env">): FlowConfig {
  const named = o.config ?? (o.env.CRW_FLOW_CONFIG || undefined);
  const path = named ? resolve(named) : join(o.state, "config.json");
  if (!named && !existsSync(path)) return {};
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    return input(`config file ${path}: cannot read it as JSON (${(e as Error).message})`);
  }
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".") || "(top level)"}: ${i.message}`);
    return input(`config file ${path}: ${issues.join("; ")}`);
  }
  return parsed.data;
}

/** The API of a model name (`<api>:<id>`), checked: `source` says where the name came from. */
function checkModelName(name: string, source: string): LocalApi | "scripted" {
  if (name === "scripted") return name;
  const m = /^([a-z-]+):.+$/.exec(name);
  const known = m?.[1] && (LOCAL_APIS as readonly string[]).includes(m[1]) ? (m[1] as LocalApi) : null;
  return (
    known ??
    input(`${source} ${name}: not a model (scripted, or ${LOCAL_APIS.map((a) => `${a}:<id>`).join(", ")})`)
  );
}

/** The first of flag, variable, file value that is set, with its source for an error message. */
function pick(...candidates: [string | undefined, string][]): [string, string] | null {
  for (const [value, source] of candidates) if (value) return [value, source];
  return null;
}

/**
 * The spec's `local` for a start: every value checked here (exit 2 naming its source), before anything is
 * written. A `--script` without `--model` is a scripted run whatever the environment says (the demo's
 * offline run stays offline with `CRW_MODEL` set for the daemon); base URL and key variable from the
 * environment or the file apply to a provider model only, as flags they refuse a scripted one.
 */
export function resolveLocalModel(o: LocalModelOptions): Omit<LocalSpec, "script"> {
  const file = readFlowConfig(o);
  const chosen = pick(
    [o.model, "--model"],
    [o.script === undefined ? o.env.CRW_MODEL : undefined, "CRW_MODEL"],
    [o.script === undefined ? file.models?.default : undefined, "config file models.default"],
  ) ?? ["scripted", "--model"];
  const [model, source] = chosen;
  const modelApi = checkModelName(model, source);
  if (modelApi === "scripted") {
    if (o.baseUrl !== undefined || o.apiKeyEnv !== undefined)
      input("--model-base-url and --model-api-key-env go with a provider model, not scripted");
    return { model };
  }
  const baseUrl = pick(
    [o.baseUrl, "--model-base-url"],
    [o.env.CRW_MODEL_BASE_URL, "CRW_MODEL_BASE_URL"],
    [file.models?.baseUrls?.[modelApi], `config file models.baseUrls.${modelApi}`],
  );
  if (baseUrl && !isHttpUrl(baseUrl[0])) input(`${baseUrl[1]} '${baseUrl[0]}' is not an http(s) URL`);
  const keyEnv = pick(
    [o.apiKeyEnv, "--model-api-key-env"],
    [o.env.CRW_MODEL_API_KEY_ENV, "CRW_MODEL_API_KEY_ENV"],
    [file.models?.apiKeyEnv?.[modelApi], `config file models.apiKeyEnv.${modelApi}`],
  );
  if (keyEnv && !KEY_ENV_NAME.test(keyEnv[0]))
    input(`${keyEnv[1]} '${keyEnv[0]}' is not an environment variable name (A-Z, 0-9, _)`);
  return {
    model,
    ...(baseUrl ? { base_url: baseUrl[0] } : {}),
    ...(keyEnv ? { api_key_env: keyEnv[0] } : {}),
  };
}

/** The API of a checked model name (the spec's); `scripted` for none. */
function apiOf(name: string): string {
  const colon = name.indexOf(":");
  return colon < 0 ? name : name.slice(0, colon);
}

/**
 * brain's ModelConfig of a local run's provider model, from what its spec recorded: the key is looked up
 * by brain in the named variable (or the API's usual one) when the call runs.
 */
export function localModelConfig(
  local: LocalSpec | undefined,
  brain: Pick<typeof Brain, "modelConfigFor">,
): Brain.ModelConfig {
  const name = local?.model ?? "scripted";
  const key = apiOf(name) as LocalApi;
  return brain.modelConfigFor(name, {
    ...(local?.base_url ? { baseUrls: { [key]: local.base_url } } : {}),
    ...(local?.api_key_env ? { apiKeyEnv: { [key]: local.api_key_env } } : {}),
  });
}

/** A held call's detail: the provider's message, and the server it came from when the run names one. */
export function providerFailureDetail(message: string, local: LocalSpec | undefined): string {
  return local?.base_url ? `${message} (model server ${local.base_url})` : message;
}
