import { changedPaths } from "./diff.js";
import { WorkspaceError } from "./errors.js";
import { git, gitLine, runGit } from "./git.js";
import { makeCommit } from "./merge.js";
import { checkedOutBranch, treeOf, worktreeTop } from "./repository.js";

export interface CommitLeftoversOptions {
  /** The child's worktree: an `IsolatedWorktree`, or its path and branch as recorded. */
  worktree: { path: string; branch: string };
  message: string;
}

export interface LeftoversCommit {
  /** The branch's tip after the call, whether or not it made a commit. */
  commit: string;
  /** Paths the commit added, changed or deleted; empty when nothing was left. */
  changedPaths: string[];
  committed: boolean;
}

/**
 * Commits everything the child left in its worktree: new, changed and deleted files, as `git add --all`
 * sees them (so `.gitignore` holds), on the worktree's branch with crw's identity. The agent never commits;
 * crw does, here. Idempotent: with nothing left (a second call) no commit is made. The commit is made by
 * `commit-tree`, so the user's hooks and signing settings play no part, and the branch moves by a
 * compare-and-swap (`ref_moved` if it moved meanwhile). A worktree whose HEAD is no longer the branch is
 * `worktree_off_branch`: committing there would put the work on some other branch.
 */
export async function commitLeftovers(options: CommitLeftoversOptions): Promise<LeftoversCommit> {
  const { branch } = options.worktree;
  const path = await worktreeTop(options.worktree.path);
  const onBranch = await checkedOutBranch(path);
  if (onBranch !== branch)
    throw new WorkspaceError("worktree_off_branch", `${path} is on ${onBranch ?? "a detached HEAD"}`, {
      path,
      branch,
      found: onBranch,
    });
  const tip = await gitLine(path, ["rev-parse", "--verify", `refs/heads/${branch}^{commit}`]);
  await git(path, ["add", "--all", "--", "."]);
  const tree = await gitLine(path, ["write-tree"]);
  if (tree === (await treeOf(path, tip))) return { commit: tip, changedPaths: [], committed: false };

  const commit = await makeCommit(path, tree, [tip], options.message);
  const ref = `refs/heads/${branch}`;
  const moved = await runGit(path, ["update-ref", "-m", "crw: commit leftovers", ref, commit, tip]);
  if (moved.exitCode !== 0)
    throw new WorkspaceError("ref_moved", `${branch} moved while its leftovers were committed`, {
      branch,
      expected: tip,
      stderr: moved.stderr.trim(),
    });
  return { commit, changedPaths: await changedPaths(path, tip, commit), committed: true };
}
