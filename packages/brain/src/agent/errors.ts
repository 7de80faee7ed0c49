/**
 * Errors of the agent loop. A refused tool call is data in the transcript (the model sees the message) and
 * typed in the turn outcome; provider failures come back as a turn with `stopReason: "error"`, never as a
 * rejected promise. Across processes match on `name` and `code`.
 */
export type ToolCallRefusedCode =
  | "tool_not_allowed"
  | "tool_denied"
  | "read_only"
  | "outside_work_dir"
  | "git_metadata"
  | "work_dir_moved"
  | "unknown_tool";

export class ToolCallRefusedError extends Error {
  override readonly name = "ToolCallRefusedError";
  readonly retryable = false;
  constructor(
    readonly code: ToolCallRefusedCode,
    message: string,
    readonly context: Readonly<{ toolName: string; subject?: string; entry?: string }>,
  ) {
    super(message);
  }
}

/**
 * The shell tool's sandbox cannot run here: bwrap is missing (`bwrap_missing`), the kernel or a container
 * policy refuses its namespaces (`namespaces_unavailable`), or it failed to build the mounts
 * (`sandbox_setup_failed`). The command never ran, and never runs unsandboxed instead; the message says
 * what the operator has to change, so retrying without that change cannot help.
 */
export type SandboxUnavailableCode = "bwrap_missing" | "namespaces_unavailable" | "sandbox_setup_failed";

export class SandboxUnavailableError extends Error {
  override readonly name = "SandboxUnavailableError";
  readonly retryable = false;
  constructor(
    readonly code: SandboxUnavailableCode,
    message: string,
    readonly context: Readonly<{ bwrap: string; detail?: string }>,
  ) {
    super(message);
  }
}

export type AgentConfigErrorCode = "invalid_model_config" | "missing_api_key" | "invalid_turn_input";

export class AgentConfigError extends Error {
  override readonly name = "AgentConfigError";
  readonly retryable = false;
  constructor(
    readonly code: AgentConfigErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
  }
}

/** The wire shape of an error inside an outcome or an IPC frame. */
export interface ErrorData {
  readonly name: string;
  readonly code: string;
  readonly message: string;
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}

export function errorData(e: unknown): ErrorData {
  const error = toError(e);
  const code = (error as { code?: unknown }).code;
  return { name: error.name, code: typeof code === "string" ? code : "error", message: error.message };
}
