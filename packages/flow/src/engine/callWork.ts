import { git } from "../git/exec.js";
import { commitTree, type ExecutorHeadMoved, moveHead, pendingTree, strayRef } from "../git/stray.js";
import { headOf } from "../git/worktree.js";
import type { RowOf } from "../journal/rows.js";
import type { CallWork } from "../journal/workRows.js";
import { WRITING_ROLES } from "../run/roles.js";
import type { RunContext } from "./runContext.js";

/**
 * What a call changed, for its completed row. An executor's changes (its worktree as it stands, untracked
 * files too, its subagent's own commits included) become one commit on the call's start, made by crw: the
 * commit object first, then its intent row, then the worktree's HEAD moved to it. A resumed call that finds
 * the intent for the same tree takes that commit, so no call is ever committed twice. Every other role's
 * call changed nothing the run keeps (its start is still told, so a reviewer knows what it looked at).
 * Null for a call with no worktree (the repository is no git checkout, or the call was given a directory).
 */
export async function callWork(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
  attempt: number,
  /** The worktree's pending tree when the caller has just taken it (the proof's state). */
  taken?: string,
): Promise<CallWork | null> {
  const a = prepared.allocation;
  if (a.kind !== "worktree" || !a.start) return null;
  const start = a.start;
  if (!WRITING_ROLES.has(prepared.role)) return { start, commit: null, paths: [] };
  const worktree = a.workspace;
  const tree = taken ?? (await pendingTree(worktree));
  const intended = commitIntents(rc, call).findLast((r) => r.tree === tree);
  if (intended) {
    const head = await headOf(worktree);
    if (head !== intended.commit) await moveHead(worktree, intended.commit, head);
    return { start, commit: intended.commit, paths: intended.paths };
  }
  if (tree === (await git(worktree, ["rev-parse", `${start}^{tree}`])))
    return { start, commit: null, paths: [] };
  const observedHead = await headOf(worktree);
  const message = `crw flow: ${call} (${prepared.role})\n\nrun ${rc.runId}, attempt ${attempt}\n`;
  const commit = await commitTree(worktree, tree, start, message);
  const paths = (await git(worktree, ["diff", "--name-only", "--no-renames", "-z", start, commit]))
    .split("\0")
    .filter((p) => p !== "");
  rc.append([
    {
      type: "commit_intended",
      call,
      op: call,
      attempt,
      commit,
      parent: start,
      observed_head: observedHead,
      tree,
      paths,
    },
  ]);
  await moveHead(worktree, commit, observedHead);
  return { start, commit, paths };
}

function commitIntents(rc: RunContext, call: string): RowOf<"commit_intended">[] {
  return rc.rowsOf(call).filter((r): r is RowOf<"commit_intended"> => r.type === "commit_intended");
}

/**
 * The commit an executor's worktree is to be at: crw's last commit of this call (its intent row), else the
 * call's start. A HEAD elsewhere is the subagent's own commit.
 */
export function expectedHeadOf(rc: RunContext, call: string, start: string): string {
  return commitIntents(rc, call).at(-1)?.commit ?? start;
}

/** The HEAD crw's last commit intent of the call observed, when it has not moved HEAD to its commit yet. */
export function intentObservedHead(rc: RunContext, call: string): string | null {
  const intent = commitIntents(rc, call).at(-1);
  return intent && intent.observed_head !== intent.commit ? intent.observed_head : null;
}

/**
 * A resumed call whose HEAD crw had already moved to its commit: the subagent's own commit it moved HEAD
 * from is in the intent row, and is reported again as the completed row's executor_head_moved.
 */
export function headMovedBeforeCommit(
  rc: RunContext,
  call: string,
  prepared: RowOf<"prepared">,
): ExecutorHeadMoved | null {
  const intents = commitIntents(rc, call);
  const intent = intents.at(-1);
  const start = prepared.allocation.start;
  if (!intent || !start || intent.observed_head === start) return null;
  // an attempt after crw's own commit observes that commit: no subagent moved HEAD then
  if (intents.some((r) => r.commit === intent.observed_head)) return null;
  const node = call.replace(/\.\d+$/, "");
  return { start, head: intent.observed_head, ref: strayRef(rc.runId, node, intent.attempt, call) };
}
