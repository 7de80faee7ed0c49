import { CRW_IDENTITY, GitWorkspaceError, git, gitRun } from "./exec.js";
import { withPrivateIndex } from "./privateIndex.js";
import { headOf } from "./worktree.js";

/**
 * An executor's HEAD against the commit its worktree is to be at, and what a subagent's own commit
 * becomes. The expected commit is the node's last crw.commit after the allocation the worktree was made
 * or restored for, else that allocation's start. A HEAD the subagent moved is kept on
 * `refs/crw/flow/<run>/stray/<node>/a<attempt>-<call>` (each executor call of one allocation, a build
 * and its fix rounds, keeps its own): created by a compare-and-swap against no ref, moved only by a
 * fast-forward to a descendant with the commit it holds as the old value. crw.commit commits the pending
 * tree on the start with the observed HEAD as the compare-and-swap's old value, and the proof takes the
 * recorded stray HEAD whose tree is the pending tree as the call's state.
 */
export function strayRef(run: string, node: string, attempt: number, call: string): string {
  return `refs/crw/flow/${run}/stray/${node}/a${attempt}-${call}`;
}

async function checkRef(repo: string, ref: string): Promise<void> {
  const r = await gitRun(repo, ["check-ref-format", ref]);
  if (r.code !== 0) throw new GitWorkspaceError("ref_invalid", `'${ref}' is no valid ref name`, { ref });
}

export type HeadCheck = { moved: false; head: string } | { moved: true; start: string; head: string };

export async function compareHead(worktree: string, expected: string): Promise<HeadCheck> {
  const head = await headOf(worktree);
  return head === expected ? { moved: false, head } : { moved: true, start: expected, head };
}

export type StrayKept =
  | {
      kept: true;
      how: "created" | "fast_forward" | "unchanged";
      ref: string;
      head: string;
      old: string | null;
    }
  | { kept: false; reason: "not_fast_forward"; ref: string; head: string; current: string };

async function refValue(repo: string, ref: string): Promise<string | null> {
  const r = await gitRun(repo, ["rev-parse", "-q", "--verify", `${ref}^{commit}`]);
  return r.code === 0 ? r.stdout.trim() : null;
}

/**
 * Keeps `head` on the stray ref: created against no ref, else moved by a fast-forward with the held commit
 * as the old value. A concurrent writer makes the compare-and-swap fail, and the ref is read again.
 */
export async function keepStray(options: { repo: string; ref: string; head: string }): Promise<StrayKept> {
  const { repo, ref, head } = options;
  await checkRef(repo, ref);
  for (let i = 0; i < 3; i++) {
    const current = await refValue(repo, ref);
    if (current === null) {
      const r = await gitRun(repo, ["update-ref", "-m", "crw flow: stray head", ref, head, ""]);
      if (r.code === 0) return { kept: true, how: "created", ref, head, old: null };
      continue;
    }
    if (current === head) return { kept: true, how: "unchanged", ref, head, old: current };
    const ff = await gitRun(repo, ["merge-base", "--is-ancestor", current, head]);
    if (ff.code !== 0) return { kept: false, reason: "not_fast_forward", ref, head, current };
    const r = await gitRun(repo, ["update-ref", "-m", "crw flow: stray head", ref, head, current]);
    if (r.code === 0) return { kept: true, how: "fast_forward", ref, head, old: current };
  }
  throw new GitWorkspaceError("git_failed", `the stray ref ${ref} kept changing under its compare-and-swap`, {
    ref,
  });
}

/** The completed row's executor_head_moved member. */
export interface ExecutorHeadMoved {
  start: string;
  head: string;
  ref: string;
}

/**
 * After an executor call: compares the worktree's HEAD with the expected commit and keeps a moved HEAD on
 * the call's stray ref. Answers the executor_head_moved data, or null when HEAD did not move.
 */
export async function recordExecutorHead(options: {
  repo: string;
  worktree: string;
  expected: string;
  run: string;
  node: string;
  attempt: number;
  call: string;
}): Promise<{ moved: ExecutorHeadMoved | null; kept: StrayKept | null }> {
  const check = await compareHead(options.worktree, options.expected);
  if (!check.moved) return { moved: null, kept: null };
  const ref = strayRef(options.run, options.node, options.attempt, options.call);
  const kept = await keepStray({ repo: options.repo, ref, head: check.head });
  return { moved: { start: check.start, head: check.head, ref }, kept };
}

/** The worktree's pending tree: every file as it is, untracked ones too, written through a private index. */
export function pendingTree(worktree: string): Promise<string> {
  return withPrivateIndex(async (env) => {
    await git(worktree, ["read-tree", "HEAD"], { env });
    await git(worktree, ["add", "-A", "."], { env });
    return git(worktree, ["write-tree"], { env });
  });
}

/** A commit object of `tree` on `parent` in crw's identity: written, referenced by nothing yet. */
export function commitTree(dir: string, tree: string, parent: string, message: string): Promise<string> {
  return git(dir, ["commit-tree", tree, "-p", parent, "-F", "-"], { env: CRW_IDENTITY, input: message });
}

/** Moves the worktree's HEAD from `observedHead` to `commit` (compare-and-swap) and its index to the commit. */
export async function moveHead(worktree: string, commit: string, observedHead: string): Promise<void> {
  const r = await gitRun(worktree, [
    "update-ref",
    "--no-deref",
    "-m",
    "crw.commit",
    "HEAD",
    commit,
    observedHead,
  ]);
  if (r.code !== 0)
    throw new GitWorkspaceError("head_moved", `HEAD of ${worktree} is no longer ${observedHead}`, {
      observedHead,
      stderr: r.stderr.trim(),
    });
  await git(worktree, ["read-tree", commit]);
}

/** The proof's state of a call: the recorded stray HEAD whose tree is the pending tree, else null. */
export async function strayHeadForTree(
  repo: string,
  heads: readonly string[],
  tree: string,
): Promise<string | null> {
  for (const head of heads) {
    const r = await gitRun(repo, ["rev-parse", "--verify", `${head}^{tree}`]);
    if (r.code === 0 && r.stdout.trim() === tree) return head;
  }
  return null;
}
