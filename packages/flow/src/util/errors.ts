/** Exit codes of every `crw flow` command: 0 ok, 1 refused or failed as the seed says, 2 input error. */
export const EXIT_OK = 0;
export const EXIT_REFUSED = 1;
export const EXIT_INPUT = 2;

export type FlowErrorCode =
  | "input"
  | "run_not_found"
  | "run_id_invalid"
  | "tmpdir_unusable"
  | "run_env_unusable"
  | "journal_corrupt"
  | "journal_version"
  | "digest_mismatch"
  | "mixed_backend"
  | "workflow_invalid"
  | "workflow_failed"
  | "run_live"
  | "state_unwritable"
  | "host"
  | "no_branch"
  | "run_not_ended"
  | "merge_conflict"
  | "worktree_dirty"
  | "land_failed";

/**
 * The one error class of the flow package: a code that says what went wrong, the exit code a command
 * answers for it, and readonly context. Across processes match on `code`, never on `instanceof`.
 */
export class FlowError extends Error {
  override readonly name = "FlowError";
  constructor(
    readonly code: FlowErrorCode,
    message: string,
    readonly exitCode: number = EXIT_INPUT,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
  }
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
