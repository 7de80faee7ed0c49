import { type ExecutorHeadMoved, pendingTree, recordExecutorHead, strayHeadForTree } from "../git/stray.js";
import { ensureWorktree, headOf } from "../git/worktree.js";
import type { RowOf } from "../journal/rows.js";
import { WRITING_ROLES } from "../run/roles.js";
import { callWork, expectedHeadOf, headMovedBeforeCommit, intentObservedHead } from "./callWork.js";
import type { RunContext } from "./runContext.js";

export interface Allocation {
  workspace: string;
  kind: "scratch" | "worktree" | "given";
  start?: string;
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
    // a process that died between crw's commit intent and moving HEAD left HEAD where the intent saw it
    const head = await headOf(a.workspace);
    if (head === intentObservedHead(rc, call)) return headMovedBeforeCommit(rc, call, prepared);
    const { moved, kept } = await recordExecutorHead({
      repo: rc.spec.repo,
      worktree: a.workspace,
      expected: expectedHeadOf(rc, call, a.start),
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
    return moved ?? headMovedBeforeCommit(rc, call, prepared);
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

/**
 * The members of an executor call's completed row that describe its worktree: the subagent's own commit
 * (executor_head_moved), the proof's state, and what the call changed (work). Taken in that order: the
 * commit crw makes moves HEAD, so the subagent's HEAD is read first.
 */
export async function completionMembers(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
  attempt: number,
): Promise<Partial<Pick<RowOf<"completed">, "executor_head_moved" | "executor_state" | "work">>> {
  const headMoved = await executorHeadMoved(rc, call, prepared, attempt);
  const state = await executorState(rc, call, prepared, headMoved);
  const work = await callWork(rc, call, prepared, attempt, state?.pending_tree);
  return {
    ...(headMoved ? { executor_head_moved: headMoved } : {}),
    ...(state ? { executor_state: state } : {}),
    ...(work ? { work } : {}),
  };
}
