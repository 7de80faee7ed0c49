import { readFileSync } from "node:fs";
import { isAbsolute } from "node:path";
import { FlowError } from "../util/errors.js";
import { writeFileAtomic } from "../util/fsx.js";

/**
 * run.json (`crw-flow-run/1`): what a run was started with. Written once by the start and never rewritten.
 * `env` is optional (a spec written before it has none and launches with the caller's environment); today
 * it holds TMPDIR alone, as the start's tmploc answered it.
 *
 * Parsed by hand, not with zod: the owner's per-step command (`crw flow next`) reads it and must start
 * fast; the checks are the same a schema would make.
 */
export const SPEC_FORMAT = "crw-flow-run/1";

/**
 * The local backend's model (`scripted`, `openai-responses:<id>`, …), its script file if any, and where its
 * provider is: the base URL of the server and the name of the variable holding the key, each only when the
 * start was given one (else brain's defaults: the public endpoint, the API's usual variable). Never the key
 * itself: the run's process reads the variable when a call runs, so a resume needs it in its environment.
 */
export interface LocalSpec {
  model: string;
  script: string | null;
  base_url?: string;
  api_key_env?: string;
}

/** The name of an environment variable that holds a key, as brain's model configuration accepts it. */
export const KEY_ENV_NAME = /^[A-Z_][A-Z0-9_]*$/;

/** An http(s) URL: what a model server's base URL must be. */
export function isHttpUrl(value: string): boolean {
  try {
    const url = new URL(value);
    return (url.protocol === "http:" || url.protocol === "https:") && url.hostname !== "";
  } catch {
    return false;
  }
}

export interface RunSpec {
  format: typeof SPEC_FORMAT;
  run_id: string;
  workflow: string;
  workflow_name: string;
  input: unknown;
  backend: "session" | "app-server" | "local";
  local?: LocalSpec;
  owner: string | null;
  pool: number;
  repo: string;
  /** The host transport as one string: a ws:// URL or a command line; empty for the adapter's default. */
  host: string;
  created_at: string;
  env?: { TMPDIR: string };
  /** Test and tuning knobs: how often the run polls, and SessionConfig.LostAfter. */
  poll_ms?: number;
  lost_after_ms?: number;
  /** SessionConfig.WakeAfter, RenotifyMax and UnresponsiveAfter of the owner's wakes (defaults 15 min, 1 h, 2 h). */
  wake_after_ms?: number;
  /** SessionConfig.Trace: digests of P, the owner's checkout and the shared state at bind and harvest. */
  trace?: boolean;
  /**
   * A run with an evidence cwd: each spawn step of a gated executor role names a flow evidence record, written
   * under the cwd the host reports for the bound subagent (where its stop hook claims its receipt).
   */
  evidence?: boolean;
  renotify_max_ms?: number;
  unresponsive_after_ms?: number;
  /** The run's token ceiling: no new call starts once the run's figure (total tokens) reaches it. */
  token_ceiling?: number;
  /**
   * How many refusals of one step (pair_mismatch, refused) before its call is held for a decision
   * (default 3); an owner's `retry` reports are bounded at five times this.
   */
  refusal_bound?: number;
}

export function writeSpec(path: string, spec: RunSpec): void {
  writeFileAtomic(path, `${JSON.stringify(spec, null, 2)}\n`, true);
}

export function readSpec(path: string): RunSpec {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    throw new FlowError(
      "run_not_found",
      `no run at ${path.replace(/\/run\.json$/, "")} (run.json missing)`,
      2,
    );
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new FlowError("input", `${path} is not JSON`, 2);
  }
  return checkSpec(raw, path);
}

export function checkSpec(raw: unknown, source = "run.json"): RunSpec {
  const bad = (what: string): never => {
    throw new FlowError("input", `${source}: ${what}`, 2);
  };
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return bad("not an object");
  const o = raw as Record<string, unknown>;
  if (o.format !== SPEC_FORMAT) bad(`format is not ${SPEC_FORMAT}`);
  for (const key of ["run_id", "workflow", "workflow_name", "repo", "created_at"]) {
    if (typeof o[key] !== "string") bad(`${key} is not a string`);
  }
  if (!isAbsolute(o.workflow as string)) bad("workflow is not an absolute path");
  if (o.backend !== "session" && o.backend !== "app-server" && o.backend !== "local")
    bad("backend is neither session, app-server nor local");
  if (o.local !== undefined) {
    const l = o.local as Record<string, unknown>;
    if (l === null || typeof l !== "object" || typeof l.model !== "string")
      bad("local.model is not a string");
    if (l.script !== null && (typeof l.script !== "string" || !isAbsolute(l.script)))
      bad("local.script is not an absolute path or null");
    if (l.base_url !== undefined && (typeof l.base_url !== "string" || !isHttpUrl(l.base_url)))
      bad("local.base_url is not an http(s) URL");
    if (
      l.api_key_env !== undefined &&
      (typeof l.api_key_env !== "string" || !KEY_ENV_NAME.test(l.api_key_env))
    )
      bad("local.api_key_env is not an environment variable name");
  }
  if (o.owner !== null && typeof o.owner !== "string") bad("owner is not a string or null");
  if (typeof o.pool !== "number" || !Number.isInteger(o.pool) || o.pool < 1)
    bad("pool is not a positive integer");
  if (typeof o.host !== "string") bad("host is not a string");
  if (o.env !== undefined) {
    const env = o.env as Record<string, unknown>;
    if (env === null || typeof env !== "object" || typeof env.TMPDIR !== "string")
      bad("env.TMPDIR is not a string");
  }
  if (o.trace !== undefined && typeof o.trace !== "boolean") bad("trace is not a boolean");
  if (o.evidence !== undefined && typeof o.evidence !== "boolean") bad("evidence is not a boolean");
  for (const key of [
    "poll_ms",
    "lost_after_ms",
    "token_ceiling",
    "wake_after_ms",
    "renotify_max_ms",
    "unresponsive_after_ms",
    "refusal_bound",
  ]) {
    if (o[key] !== undefined && (typeof o[key] !== "number" || (o[key] as number) < 1))
      bad(`${key} is not a positive number`);
  }
  return o as unknown as RunSpec;
}
