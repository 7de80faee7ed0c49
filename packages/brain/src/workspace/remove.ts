import { existsSync } from "node:fs";
import { WorkspaceError } from "./errors.js";
import { git, runGit } from "./git.js";
import { commonDir, samePath, statusPaths, worktreeTop } from "./repository.js";
import { oneWorktreeChangeAtATime } from "./serial.js";

export interface RemoveIsolatedWorktreeOptions {
  path: string;
  /**
   * Remove even with changes not committed (they are lost). Without it a worktree holding changed or
   * untracked files is refused as `worktree_dirty`, so a cleanup that forgot `commitLeftovers` loses nothing.
   * Ignored files never count.
   */
  force?: boolean;
}

/**
 * Removes a child's worktree and its registration; the branch stays, so what the child did can still be
 * landed or looked at. Idempotent: a path that is gone is a success (`removed: false`).
 */
export async function removeIsolatedWorktree(
  options: RemoveIsolatedWorktreeOptions,
): Promise<{ removed: boolean }> {
  const { path } = options;
  if (!existsSync(path)) return { removed: false };
  const top = await worktreeTop(path);
  if (!samePath(top, path))
    throw new WorkspaceError("invalid_input", `${path} is not the top of a worktree`, { path, top });
  // run from the shared git directory: the worktree being removed is no place to stand
  const gitDir = await commonDir(path);
  const args = ["worktree", "remove", ...(options.force ? ["--force"] : []), path];
  const r = await oneWorktreeChangeAtATime(gitDir, () => runGit(gitDir, args));
  if (r.exitCode === 0) return { removed: true };
  const status = await git(path, ["status", "--porcelain=v1", "-z"], { env: { GIT_OPTIONAL_LOCKS: "0" } });
  const paths = statusPaths(status);
  if (!options.force && paths.length > 0)
    throw new WorkspaceError("worktree_dirty", `${path} holds changes not committed`, { path, paths });
  throw new WorkspaceError("git_failed", `git worktree remove failed: ${r.stderr.trim()}`, {
    path,
    stderr: r.stderr.trim(),
  });
}
