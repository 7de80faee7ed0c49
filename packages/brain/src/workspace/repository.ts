import { realpathSync } from "node:fs";
import { resolve } from "node:path";
import { WorkspaceError } from "./errors.js";
import { git, gitLine, nulFields, runGit } from "./git.js";

/** Reading a repository: its top, its commits and branches, its worktrees. Nothing here writes. */

/** The top of the working tree `dir` is in; `not_a_repository` when it is in none. */
export async function worktreeTop(dir: string): Promise<string> {
  const r = await runGit(dir, ["rev-parse", "--show-toplevel"]);
  if (r.exitCode !== 0 || r.stdout.trim() === "")
    throw new WorkspaceError("not_a_repository", `${dir} is not inside a git working tree`, {
      dir,
      stderr: r.stderr.trim(),
    });
  return resolve(r.stdout.trim());
}

/** The repository's git directory shared by all its worktrees, absolute. */
export async function commonDir(dir: string): Promise<string> {
  return resolve(dir, await gitLine(dir, ["rev-parse", "--git-common-dir"]));
}

/** The commit `rev` names, or null when it names none. */
export async function commitOf(repo: string, rev: string): Promise<string | null> {
  const r = await runGit(repo, ["rev-parse", "-q", "--verify", "--end-of-options", `${rev}^{commit}`]);
  return r.exitCode === 0 ? r.stdout.trim() : null;
}

/** The tree of a commit: two commits with one tree hold the same files. */
export async function treeOf(repo: string, commit: string): Promise<string> {
  return gitLine(repo, ["rev-parse", "--verify", "--end-of-options", `${commit}^{tree}`]);
}

/** The tip of a local branch; `unknown_ref` when there is no such branch. */
export async function branchTip(repo: string, branch: string): Promise<string> {
  const tip = await commitOf(repo, `refs/heads/${branch}`);
  if (tip === null) throw new WorkspaceError("unknown_ref", `there is no branch '${branch}'`, { branch });
  return tip;
}

/** The short name of the branch checked out in `dir`, or null when its HEAD is detached. */
export async function checkedOutBranch(dir: string): Promise<string | null> {
  const r = await runGit(dir, ["symbolic-ref", "-q", "HEAD"]);
  const ref = r.exitCode === 0 ? r.stdout.trim() : "";
  return ref.startsWith("refs/heads/") ? ref.slice("refs/heads/".length) : null;
}

export async function isAncestor(repo: string, ancestor: string, descendant: string): Promise<boolean> {
  const r = await runGit(repo, ["merge-base", "--is-ancestor", ancestor, descendant]);
  if (r.exitCode === 0) return true;
  if (r.exitCode === 1) return false;
  throw new WorkspaceError("git_failed", `git merge-base failed: ${r.stderr.trim()}`, {
    ancestor,
    descendant,
  });
}

/** `invalid_input` unless git accepts `branch` as a branch name (which also keeps it from reading as an option). */
export async function assertBranchName(repo: string, branch: string): Promise<void> {
  // the full ref, not `--branch`: that form would expand `@{-1}` into some other branch's name
  const r = await runGit(repo, ["check-ref-format", `refs/heads/${branch}`]);
  if (r.exitCode !== 0 || branch.startsWith("-"))
    throw new WorkspaceError("invalid_input", `'${branch}' is not a valid branch name`, { branch });
}

/** The paths of a `git status --porcelain=v1 -z` output. */
export function statusPaths(status: string): string[] {
  const fields = nulFields(status);
  const paths: string[] = [];
  for (let i = 0; i < fields.length; i++) {
    const entry = fields[i] as string;
    paths.push(entry.slice(3));
    // a rename or copy entry is followed by its source path
    if (entry[0] === "R" || entry[0] === "C") i++;
  }
  return paths;
}

/** One entry of `git worktree list`. */
export interface WorktreeEntry {
  path: string;
  head: string | null;
  /** Short branch name, or null when detached (or bare). */
  branch: string | null;
  /** Registered, but its directory is gone: `git worktree prune` would drop it. */
  prunable: boolean;
  /** Locked while `git worktree add` checks it out: one still locked so was cut off half-made. */
  initializing?: boolean;
}

export async function listWorktrees(repo: string): Promise<WorktreeEntry[]> {
  const entries: WorktreeEntry[] = [];
  let current: WorktreeEntry | null = null;
  for (const field of nulFields(await git(repo, ["worktree", "list", "--porcelain", "-z"]))) {
    if (field === "") {
      current = null;
      continue;
    }
    const space = field.indexOf(" ");
    const key = space < 0 ? field : field.slice(0, space);
    const value = space < 0 ? "" : field.slice(space + 1);
    if (key === "worktree") {
      current = { path: value, head: null, branch: null, prunable: false };
      entries.push(current);
    } else if (current && key === "HEAD") current.head = value;
    else if (current && key === "branch" && value.startsWith("refs/heads/"))
      current.branch = value.slice("refs/heads/".length);
    else if (current && key === "prunable") current.prunable = true;
    else if (current && key === "locked" && value === "initializing") current.initializing = true;
  }
  return entries;
}

/** Two spellings of one directory (a symlinked temp dir, a trailing slash) compare equal. */
export function samePath(a: string, b: string): boolean {
  return canonical(a) === canonical(b);
}

function canonical(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return resolve(p);
  }
}
