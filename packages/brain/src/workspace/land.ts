import { changedPaths } from "./diff.js";
import { WorkspaceError } from "./errors.js";
import { git, runGit } from "./git.js";
import { makeCommit, mergeTrees } from "./merge.js";
import { branchTip, isAncestor, listWorktrees, statusPaths, worktreeTop } from "./repository.js";

export interface LandBranchOptions {
  /** Any directory inside a working tree of the repository. */
  repoDir: string;
  /** The branch with the result (a child's `crw/<id>`). */
  branch: string;
  /** The branch the work started from (`IsolatedWorktree.startedFromBranch`). */
  into: string;
  /** The merge commit's message, when one is made; `Merge branch '<branch>' into <into>` by default. */
  message?: string;
}

export interface Landed {
  into: string;
  before: string;
  after: string;
  /** true when `into` moved without a merge commit (and when it did not move at all). */
  fastForward: boolean;
  /** `branch` was already in `into`: nothing changed, `after` is `before`. */
  alreadyLanded: boolean;
  /** Paths that differ between `before` and `after`. */
  changedPaths: string[];
  /** The worktree whose files were brought up to date: the one with `into` checked out, else null. */
  updatedWorktree: string | null;
}

/**
 * Merges `branch` into `into`: a fast-forward when `into` is an ancestor, else a merge commit made by crw.
 * Never a force, never a rewrite: `into` only ever moves to a descendant of where it was.
 *
 * A conflict is found (by `merge-tree`) before anything is touched and refused as `merge_conflict` with
 * the paths; `into`, its working tree and its index are exactly as they were. When `into` is checked out
 * in a worktree, that worktree is moved by `git merge --ff-only` to the result, which updates its files and
 * index; uncommitted changes to tracked files there (or untracked files the result would overwrite) are
 * refused as `worktree_dirty` rather than clobbered. When `into` is checked out nowhere, only the ref
 * moves, by a compare-and-swap from the tip read at the start (`ref_moved` if someone else moved it).
 * Landing a branch that is already in `into` is a success that changes nothing.
 */
export async function landBranch(options: LandBranchOptions): Promise<Landed> {
  const { branch, into } = options;
  const repoRoot = await worktreeTop(options.repoDir);
  const source = await branchTip(repoRoot, branch);
  const before = await branchTip(repoRoot, into);
  const landed = { into, before, alreadyLanded: false };
  if (await isAncestor(repoRoot, source, before))
    return {
      ...landed,
      after: before,
      fastForward: true,
      alreadyLanded: true,
      changedPaths: [],
      updatedWorktree: null,
    };

  // a registration whose directory is gone has no files to update: its ref alone moves
  const worktree =
    (await listWorktrees(repoRoot)).find((e) => e.branch === into && !e.prunable)?.path ?? null;
  if (worktree !== null) await assertNoTrackedChanges(worktree, into);

  const fastForward = await isAncestor(repoRoot, before, source);
  const after = fastForward
    ? source
    : await mergeCommit(repoRoot, before, source, options.message ?? `Merge branch '${branch}' into ${into}`);
  if (worktree !== null) await moveCheckout(worktree, into, before, after);
  else await moveRef(repoRoot, into, before, after, branch);
  return {
    ...landed,
    after,
    fastForward,
    changedPaths: await changedPaths(repoRoot, before, after),
    updatedWorktree: worktree,
  };
}

async function mergeCommit(repo: string, before: string, source: string, message: string): Promise<string> {
  const m = await mergeTrees(repo, before, source);
  if (!m.clean)
    throw new WorkspaceError(
      "merge_conflict",
      `landing conflicts in ${m.paths.join(", ")}: nothing was changed`,
      {
        paths: m.paths,
        before,
        source,
      },
    );
  return makeCommit(repo, m.tree, [before, source], message);
}

/** Changed tracked files (staged or not), or a merge in progress, in the worktree `into` is checked out in. */
async function assertNoTrackedChanges(worktree: string, into: string): Promise<void> {
  const status = await git(worktree, ["status", "--porcelain=v1", "-z", "--untracked-files=no"], {
    env: { GIT_OPTIONAL_LOCKS: "0" },
  });
  const paths = statusPaths(status);
  if (paths.length > 0)
    throw new WorkspaceError("worktree_dirty", `${worktree} (on ${into}) has uncommitted changes`, {
      worktree,
      into,
      paths,
    });
}

/**
 * git's own fast-forward moves the files, index and ref together, and checks before writing anything that
 * no local change is lost: what it refuses it leaves as it was.
 */
async function moveCheckout(worktree: string, into: string, before: string, after: string): Promise<void> {
  const r = await runGit(worktree, ["merge", "--ff-only", "--quiet", "--no-stat", after]);
  if (r.exitCode === 0) return;
  const context = { worktree, into, before, after, stderr: r.stderr.trim() };
  if ((await branchTip(worktree, into)) !== before)
    throw new WorkspaceError("ref_moved", `${into} moved while landing`, context);
  if (/would be overwritten|untracked working tree files/.test(r.stderr))
    throw new WorkspaceError("worktree_dirty", `${worktree} has files the result would overwrite`, context);
  throw new WorkspaceError("git_failed", `git merge --ff-only failed in ${worktree}`, context);
}

async function moveRef(repo: string, into: string, before: string, after: string, branch: string) {
  const r = await runGit(repo, [
    "update-ref",
    "-m",
    `crw: land ${branch}`,
    `refs/heads/${into}`,
    after,
    before,
  ]);
  if (r.exitCode !== 0)
    throw new WorkspaceError("ref_moved", `${into} moved while landing`, {
      into,
      before,
      after,
      stderr: r.stderr.trim(),
    });
}
