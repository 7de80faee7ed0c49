import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";
import { type CatalogConfig, catalogConfigSchema, type McpConfig, mcpConfigSchema } from "@crw/brain";
import { z } from "zod";

/**
 * The daemon's configuration, read once at start: defaults, then the JSON file (`--config`, else
 * `<dataDir>/daemon.json` when it exists), then the environment. Inner code trusts the resolved type.
 */
export const PROVIDER_APIS = [
  "openai-responses",
  "openai-completions",
  "anthropic-messages",
  "openai-codex-responses",
] as const;
export type ProviderApi = (typeof PROVIDER_APIS)[number];

const fileSchema = z
  .object({
    dataDir: z.string().min(1),
    databaseUrl: z.string().url(),
    host: z.string().min(1),
    port: z.number().int().min(0).max(65_535),
    logLevel: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]),
    shutdownGraceMs: z.number().int().min(0).max(600_000),
    /** How long the shutdown's restart checkpoint may take before the stop fails (nonzero exit). */
    shutdownCheckpointMs: z.number().int().min(100).max(3_600_000),
    /**
     * How long a runtime closed without its checkpoint (past the deadline, or on a lost database or lease)
     * waits for each of its parts (runner pool, engine, service, database pool) before it goes on.
     */
    abandonedCloseMs: z.number().int().min(100).max(60_000),
    /** MCP servers whose tools are bridged into every session's catalog (`mcp__<server>__<tool>`). */
    mcp: mcpConfigSchema,
    /** The whole-catalog deferral policy shared by every session and placement. */
    tools: catalogConfigSchema,
    runtime: z
      .object({
        subagentRunnerEnabled: z.boolean(),
        maxRunners: z.number().int().min(0).max(256),
        turnsPerRunner: z.number().int().min(1).max(64),
        /** The workflow engine's bound on nodes running at once per workflow; default the engine's own. */
        maxActiveNodes: z.number().int().min(1).max(1024),
        /**
         * How often the live takeover checks for work of daemons that died (one cheap query; a recovery
         * pass only when it finds some). 0 turns the sweep off (boot recovery alone then takes it).
         */
        takeoverSweepMs: z.number().int().min(0).max(60_000),
        /** The longest wait between two probes of a lost database (doubling from 250 ms up to it). */
        databaseRetryMaxMs: z.number().int().min(250).max(60_000),
      })
      .partial()
      .strict(),
    models: z
      .object({
        /** The model of sessions created without one: `scripted` or `<api>:<model id>`. */
        default: z.string().min(1).max(256),
        baseUrls: z.partialRecord(z.enum(PROVIDER_APIS), z.string().url()),
        apiKeyEnv: z.partialRecord(z.enum(PROVIDER_APIS), z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/)),
      })
      .partial()
      .strict(),
    /** Boot recovery's bound on continuation attempts per delegated call. */
    maxRecoveryAttempts: z.number().int().min(0).max(100),
    /**
     * How long a foreground delegation's child may show no progress before its caller is let go (moved to
     * the background, its result delivered through the inbox); 0 never lets it go.
     */
    stallAfterMs: z.number().int().min(0).max(86_400_000),
  })
  .partial()
  .strict();

export type DaemonConfigFile = z.infer<typeof fileSchema>;
/** The config file as written (defaults inside sections, e.g. an MCP server's `args`, may be left out). */
export type DaemonConfigInput = z.input<typeof fileSchema>;

export interface DaemonConfig {
  /** Where the daemon keeps its state: the embedded PostgreSQL cluster, the lock and state files, logs. */
  dataDir: string;
  /** An external PostgreSQL; undefined runs an embedded one under `<dataDir>/postgres`. */
  databaseUrl: string | undefined;
  host: string;
  /** 0 picks a free port (the state file says which). */
  port: number;
  logLevel: "fatal" | "error" | "warn" | "info" | "debug" | "trace" | "silent";
  /** How long a graceful shutdown waits for in-flight work (journal writes, turns) before it closes anyway. */
  shutdownGraceMs: number;
  /**
   * The bound of the shutdown's restart checkpoint: when captured journal writes have not committed by then,
   * the stop logs what was still pending and the process exits nonzero (boot recovery takes the rest).
   */
  shutdownCheckpointMs: number;
  /** The bound on each part of a runtime's close once its checkpoint is abandoned. */
  abandonedCloseMs: number;
  /** MCP servers bridged into every session's tools; a server that cannot start fails the daemon's start. */
  mcp: McpConfig;
  /** The tool catalog policy (threshold for deferral, extra core names). */
  tools: CatalogConfig;
  runtime: {
    subagentRunnerEnabled: boolean;
    maxRunners: number | undefined;
    turnsPerRunner: number;
    maxActiveNodes: number | undefined;
    /** The takeover sweep's period; 0: no live takeover. */
    takeoverSweepMs: number;
    /** The longest wait between two probes while the database is lost. */
    databaseRetryMaxMs: number;
  };
  /**
   * Providers: a session's model is `scripted` (the offline provider) or `<api>:<model id>`; a base URL and
   * the name of the environment variable holding the key may be set per API.
   */
  models: {
    default: string;
    baseUrls: Partial<Record<ProviderApi, string>>;
    apiKeyEnv: Partial<Record<ProviderApi, string>>;
  };
  maxRecoveryAttempts: number;
  stallAfterMs: number;
}

export class ConfigError extends Error {
  override readonly name = "ConfigError";
  readonly code = "config_invalid";
  readonly retryable = false;
  constructor(
    message: string,
    readonly source: string,
  ) {
    super(message);
  }
}

export function defaultDataDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.CRW_DAEMON_DIR) return resolve(env.CRW_DAEMON_DIR);
  if (env.CRW_HOME) return join(resolve(env.CRW_HOME), "daemon");
  return join(homedir(), ".crw", "daemon");
}

function parseFile(path: string): DaemonConfigFile {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new ConfigError(`cannot read ${path}: ${e instanceof Error ? e.message : String(e)}`, path);
  }
  const parsed = fileSchema.safeParse(raw);
  if (!parsed.success) throw new ConfigError(`${path}: ${z.prettifyError(parsed.error)}`, path);
  return parsed.data;
}

const envBool = (name: string, value: string): boolean => {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new ConfigError(`${name} must be true or false, not '${value}'`, name);
};

const envInt = (name: string, value: string, max: number, min = 0): number => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new ConfigError(`${name} must be a whole number ${min}..${max}, not '${value}'`, name);
  return n;
};

export interface LoadConfigOptions {
  /** An explicit config file (a missing one is an error); else `<dataDir>/daemon.json` if present. */
  file?: string;
  env?: NodeJS.ProcessEnv;
  /** Values from command-line flags; they win over everything. */
  overrides?: DaemonConfigInput;
}

export function loadConfig(options: LoadConfigOptions = {}): DaemonConfig {
  const env = options.env ?? process.env;
  const overrides = fileSchema.safeParse(options.overrides ?? {});
  if (!overrides.success) throw new ConfigError(z.prettifyError(overrides.error), "flags");
  const baseDir = overrides.data.dataDir ?? env.CRW_DAEMON_DIR ?? defaultDataDir(env);
  const implicit = join(resolve(baseDir), "daemon.json");
  let file: DaemonConfigFile = {};
  if (options.file) file = parseFile(options.file);
  else {
    try {
      file = parseFile(implicit);
    } catch (e) {
      if (!(e instanceof ConfigError) || !/ENOENT/.test(e.message)) throw e;
    }
  }
  const fromEnv: DaemonConfigFile = {};
  if (env.DATABASE_URL) fromEnv.databaseUrl = env.DATABASE_URL;
  if (env.CRW_DAEMON_HOST) fromEnv.host = env.CRW_DAEMON_HOST;
  if (env.CRW_DAEMON_PORT) fromEnv.port = envInt("CRW_DAEMON_PORT", env.CRW_DAEMON_PORT, 65_535);
  if (env.CRW_SHUTDOWN_CHECKPOINT_MS)
    fromEnv.shutdownCheckpointMs = envInt(
      "CRW_SHUTDOWN_CHECKPOINT_MS",
      env.CRW_SHUTDOWN_CHECKPOINT_MS,
      3_600_000,
      100,
    );
  if (env.CRW_LOG_LEVEL) fromEnv.logLevel = fileSchema.shape.logLevel.parse(env.CRW_LOG_LEVEL);
  const runtimeEnv: NonNullable<DaemonConfigFile["runtime"]> = {};
  if (env.CRW_SUBAGENT_RUNNER_ENABLED)
    runtimeEnv.subagentRunnerEnabled = envBool(
      "CRW_SUBAGENT_RUNNER_ENABLED",
      env.CRW_SUBAGENT_RUNNER_ENABLED,
    );
  if (env.CRW_MAX_RUNNERS) runtimeEnv.maxRunners = envInt("CRW_MAX_RUNNERS", env.CRW_MAX_RUNNERS, 256);
  if (env.CRW_MAX_ACTIVE_NODES)
    runtimeEnv.maxActiveNodes = envInt("CRW_MAX_ACTIVE_NODES", env.CRW_MAX_ACTIVE_NODES, 1024, 1);
  if (env.CRW_TAKEOVER_SWEEP_MS)
    runtimeEnv.takeoverSweepMs = envInt("CRW_TAKEOVER_SWEEP_MS", env.CRW_TAKEOVER_SWEEP_MS, 60_000);
  const modelsEnv = modelsFromEnv(env);

  const merged = { ...file, ...fromEnv, ...overrides.data };
  const runtime = { ...file.runtime, ...runtimeEnv, ...overrides.data.runtime };
  const models = {
    ...file.models,
    ...modelsEnv,
    ...overrides.data.models,
    baseUrls: { ...file.models?.baseUrls, ...modelsEnv.baseUrls, ...overrides.data.models?.baseUrls },
    apiKeyEnv: { ...file.models?.apiKeyEnv, ...modelsEnv.apiKeyEnv, ...overrides.data.models?.apiKeyEnv },
  };
  const dataDir = resolve(merged.dataDir ?? baseDir);
  if (!isAbsolute(dataDir)) throw new ConfigError(`dataDir must be absolute: ${dataDir}`, "dataDir");
  return {
    dataDir,
    databaseUrl: merged.databaseUrl,
    host: merged.host ?? "127.0.0.1",
    port: merged.port ?? 7420,
    logLevel: merged.logLevel ?? "info",
    shutdownGraceMs: merged.shutdownGraceMs ?? 10_000,
    shutdownCheckpointMs: merged.shutdownCheckpointMs ?? 30_000,
    abandonedCloseMs: merged.abandonedCloseMs ?? 5_000,
    mcp: merged.mcp ?? { servers: {} },
    tools: merged.tools ?? {},
    runtime: {
      subagentRunnerEnabled: runtime.subagentRunnerEnabled ?? true,
      maxRunners: runtime.maxRunners,
      turnsPerRunner: runtime.turnsPerRunner ?? 4,
      maxActiveNodes: runtime.maxActiveNodes,
      // A peer's death is noticed within about a second; the check is one indexed query.
      takeoverSweepMs: runtime.takeoverSweepMs ?? 1_000,
      databaseRetryMaxMs: runtime.databaseRetryMaxMs ?? 5_000,
    },
    models: { default: models.default ?? "scripted", baseUrls: models.baseUrls, apiKeyEnv: models.apiKeyEnv },
    maxRecoveryAttempts: merged.maxRecoveryAttempts ?? 3,
    stallAfterMs: merged.stallAfterMs ?? 600_000,
  };
}

/**
 * `CRW_MODEL` (`scripted` or `<api>:<model id>`) with `CRW_MODEL_BASE_URL` and `CRW_MODEL_API_KEY_ENV`,
 * which apply to that model's API: one real provider from the environment without a config file.
 */
function modelsFromEnv(env: NodeJS.ProcessEnv): {
  default?: string;
  baseUrls: Partial<Record<ProviderApi, string>>;
  apiKeyEnv: Partial<Record<ProviderApi, string>>;
} {
  const out: ReturnType<typeof modelsFromEnv> = { baseUrls: {}, apiKeyEnv: {} };
  const model = env.CRW_MODEL;
  if (!model) return out;
  const checked = fileSchema.shape.models.unwrap().shape.default.safeParse(model);
  if (!checked.success) throw new ConfigError(`CRW_MODEL: ${z.prettifyError(checked.error)}`, "CRW_MODEL");
  out.default = model;
  const api = model.includes(":") ? model.slice(0, model.indexOf(":")) : model;
  const known = (PROVIDER_APIS as readonly string[]).includes(api);
  if (model !== "scripted" && !model.startsWith("scripted:") && !known)
    throw new ConfigError(
      `CRW_MODEL '${model}' names no known API; use scripted or one of ${PROVIDER_APIS.join(", ")} followed by :<model id>`,
      "CRW_MODEL",
    );
  if (known && env.CRW_MODEL_BASE_URL) {
    if (!z.string().url().safeParse(env.CRW_MODEL_BASE_URL).success)
      throw new ConfigError(
        `CRW_MODEL_BASE_URL is not a URL: '${env.CRW_MODEL_BASE_URL}'`,
        "CRW_MODEL_BASE_URL",
      );
    out.baseUrls[api as ProviderApi] = env.CRW_MODEL_BASE_URL;
  }
  if (known && env.CRW_MODEL_API_KEY_ENV) out.apiKeyEnv[api as ProviderApi] = env.CRW_MODEL_API_KEY_ENV;
  return out;
}
