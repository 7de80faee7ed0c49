import { gitRun } from "../git/exec.js";
import { type ExecutorHeadMoved, pendingTree, recordExecutorHead, strayHeadForTree } from "../git/stray.js";
import { ensureWorktree, worktreePath } from "../git/worktree.js";
import type { RowOf } from "../journal/rows.js";
import { WRITING_ROLES } from "../run/roles.js";
import type { RunContext } from "./runContext.js";

export interface Allocation {
  workspace: string;
  kind: "scratch" | "worktree" | "given";
  start?: string;
}

/**
 * A call's P when the run's repository is a git checkout: a detached worktree of its own at the
 * repository's HEAD (an executor's is its attempt worktree; every other role's a call-private checkout at
 * the head option). Null when the repository is no git checkout (P is then a scratch directory).
 */
export async function worktreeAllocation(
  repo: string,
  workspacesDir: string,
  node: string,
  call: string,
): Promise<Allocation | null> {
  const head = await gitRun(repo, ["rev-parse", "--verify", "HEAD^{commit}"]);
  if (head.code !== 0) return null;
  return { workspace: worktreePath(workspacesDir, node, call), kind: "worktree", start: head.stdout.trim() };
}

/** Makes (or restores, on a resume) the worktree a prepared row allocated; written after the row. */
export async function placeWorktree(repo: string, allocation: Allocation): Promise<void> {
  if (allocation.kind !== "worktree" || !allocation.start) return;
  await ensureWorktree({ repo, path: allocation.workspace, commit: allocation.start });
}

/**
 * At the harvest of an executor call in a worktree: HEAD compared with the commit it should be at; a
 * subagent's own commit is kept on the call's stray ref, and the completed row carries
 * executor_head_moved. Never throws: a git failure is a warning and no member.
 */
export async function executorHeadMoved(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
  attempt: number,
): Promise<ExecutorHeadMoved | null> {
  const a = prepared.allocation as Allocation;
  if (a.kind !== "worktree" || !a.start || !WRITING_ROLES.has(prepared.role)) return null;
  try {
    const { moved, kept } = await recordExecutorHead({
      repo: rc.spec.repo,
      worktree: a.workspace,
      expected: a.start,
      run: rc.runId,
      node: call.replace(/\.\d+$/, ""),
      attempt,
      call,
    });
    if (kept && !kept.kept)
      rc.emit({
        type: "warning",
        message: `${call}: the stray commit was not kept: ${JSON.stringify(kept)}`,
      });
    return moved;
  } catch (e) {
    rc.emit({ type: "warning", message: `${call}: executor HEAD not compared: ${(e as Error).message}` });
    return null;
  }
}

/**
 * The proof of an executor call's state at its completed row: P's pending tree, and the recorded stray HEAD
 * (this call's executor_head_moved, and the heads the node's earlier calls recorded) whose tree is that
 * pending tree, when there is one. Never throws: a git failure is a warning and no member.
 */
export async function executorState(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
  moved: ExecutorHeadMoved | null,
): Promise<{ pending_tree: string; stray_head: string | null } | null> {
  const a = prepared.allocation as Allocation;
  if (a.kind !== "worktree" || !a.start || !WRITING_ROLES.has(prepared.role)) return null;
  try {
    const tree = await pendingTree(a.workspace);
    const node = call.replace(/\.\d+$/, "");
    const heads: string[] = moved ? [moved.head] : [];
    for (const r of rc.journal.rows) {
      if (r.type === "completed" && r.executor_head_moved && r.call.replace(/\.\d+$/, "") === node)
        heads.push(r.executor_head_moved.head);
    }
    return { pending_tree: tree, stray_head: await strayHeadForTree(rc.spec.repo, heads, tree) };
  } catch (e) {
    rc.emit({ type: "warning", message: `${call}: executor state not proven: ${(e as Error).message}` });
    return null;
  }
}
