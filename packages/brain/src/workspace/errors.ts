/**
 * Every failure of the workspace module, as one class with a `code`. Across processes match on `name` and
 * `code`, never on `instanceof`. `context` names what the caller needs to act (the conflicting paths, the
 * dirty worktree, the ref that moved) so nobody parses `message`.
 */
export type WorkspaceErrorCode =
  /** The directory is not inside a git working tree (or does not exist). */
  | "not_a_repository"
  /** A branch name git refuses, an empty branch list, a path that is no worktree's top. */
  | "invalid_input"
  /** A commit or branch that does not exist. */
  | "unknown_ref"
  /** The worktree path holds something else, or the branch is checked out somewhere else. */
  | "worktree_conflict"
  /** The worktree's HEAD is no longer its branch (the child switched branches or detached HEAD). */
  | "worktree_off_branch"
  /** Uncommitted changes that an operation would clobber or lose; `context.paths` lists them. */
  | "worktree_dirty"
  /** Branches that do not merge cleanly; `context.paths` lists the conflicting paths. Nothing was changed. */
  | "merge_conflict"
  /** A branch moved between reading it and updating it (the compare-and-swap lost). Retry from the start. */
  | "ref_moved"
  /** Another git process holds a lock of the repository. */
  | "repository_locked"
  /** git could not be started at all (not installed, not on PATH). */
  | "git_unavailable"
  /** Any other git failure: a non-zero exit, a timeout, output over the limit. */
  | "git_failed";

const RETRYABLE: ReadonlySet<WorkspaceErrorCode> = new Set(["ref_moved", "repository_locked"]);

export class WorkspaceError extends Error {
  override readonly name = "WorkspaceError";
  constructor(
    readonly code: WorkspaceErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
  /** Only a lost race clears by itself: the same call made again can succeed. */
  get retryable(): boolean {
    return RETRYABLE.has(this.code);
  }
}
