import { join, relative } from "node:path";
import {
  commitLeftovers,
  createIsolatedWorktree,
  delegatedWorkDir,
  diffStat,
  landBranch,
  type WorkDirPlacement,
  type WorkDirPolicy,
} from "@crw/brain";
import type { DelegationRepository, NewIsolatedWorktree } from "@crw/db";
import type { WorkflowNode } from "../definition/schema.js";
import type { OrchestrationJournal } from "../journal/schema.js";

/** Where the host keeps node worktrees, and the rows that remember them after the workflow's journal is gone. */
export interface NodeIsolation {
  readonly dir: string;
  readonly repo: DelegationRepository;
}

const coded = (code: string, message: string) => Object.assign(new Error(message), { code });

/**
 * An isolated node's placement: a worktree on `crw/<short child id>` made from its isolated dependencies'
 * branches merged (or the repository's HEAD when it has none), the node working at the same place inside
 * it. Kept in the journal (`nodeWorktrees`) before the child exists; made again after a crash, the same
 * branch and directory are reused. A conflict among the dependencies' branches fails the node naming the
 * paths.
 */
export async function isolateNode(
  j: OrchestrationJournal,
  id: string,
  node: WorkflowNode,
  placement: WorkDirPlacement | null,
  policy: WorkDirPolicy,
  isolation: NodeIsolation | null,
  plannedChildId: string,
): Promise<WorkDirPlacement> {
  if (!isolation) throw coded("work_dir_not_permitted", "this host keeps no worktrees for isolated nodes");
  if (placement?.target.kind !== "host")
    throw coded("work_dir_not_permitted", "an isolated node needs a working directory on this host");
  const branches = node.dependsOn.flatMap((d) => {
    const w = j.nodeWorktrees?.[d];
    return w ? [w.branch] : [];
  });
  const short = plannedChildId.slice(0, 8);
  const made = await createIsolatedWorktree({
    repoDir: placement.workDir,
    worktreesDir: isolation.dir,
    branch: `crw/${short}`,
    name: `${j.workflowId.slice(0, 8)}-${short}`,
    from: branches.length > 0 ? { branches } : { head: true },
  });
  const worktree: NewIsolatedWorktree = {
    repoRoot: made.repoRoot,
    path: made.path,
    branch: made.branch,
    baseCommit: made.baseCommit,
    startedFromBranch: made.startedFromBranch,
  };
  j.nodeWorktrees = { ...j.nodeWorktrees, [id]: worktree };
  return delegatedWorkDir(join(made.path, relative(made.repoRoot, placement.workDir)), policy);
}

/** Records an isolated node's worktree against its child, once the child row exists. */
export async function rememberNodeWorktree(
  j: OrchestrationJournal,
  id: string,
  childSessionId: string,
  isolation: NodeIsolation | null,
): Promise<void> {
  const w = j.nodeWorktrees?.[id];
  if (!w || !isolation) return;
  await isolation.repo.addNodeWorktree(childSessionId, j.principalAccountId, w, {
    workflowId: j.workflowId,
    nodeId: id,
  });
}

/** What an isolated node left, committed by crw before its result counts: the line its handover carries. */
export async function commitNodeWork(
  j: OrchestrationJournal,
  id: string,
  childSessionId: string | undefined,
  isolation: NodeIsolation | null,
): Promise<string> {
  const w = j.nodeWorktrees?.[id];
  if (!w || !isolation || !childSessionId) return "";
  const done = await commitLeftovers({
    worktree: { path: w.path, branch: w.branch },
    message: `crw: node ${id} of workflow ${j.name}`,
  });
  await isolation.repo.recordWorktreeCommit(childSessionId, j.principalAccountId, "committed", done.commit);
  const stat = await diffStat(w.repoRoot, w.baseCommit, done.commit);
  // a node that changed nothing made no commit: its branch is still where it started
  return stat.files.length === 0
    ? `\n\n[crw] isolated on branch ${w.branch}: no changes`
    : `\n\n[crw] committed on branch ${w.branch} at ${done.commit.slice(0, 12)} (${stat.summary})`;
}

export interface LandedNode {
  readonly nodeId: string;
  readonly branch: string;
  readonly into: string;
  readonly after: string;
  readonly fastForward: boolean;
  readonly alreadyLanded: boolean;
  readonly changedPaths: readonly string[];
}

/**
 * Lands a workflow's committed node branches into the branch the work started from, dependents first: a
 * dependent's branch holds its dependencies' merge, so landing it lands them too (each then lands as
 * already there) and the history keeps the workflow's own merges instead of one more per node. The first
 * conflict stops it, naming the node and the paths; what landed before it stays landed.
 */
export async function landWorkflowNodes(
  repo: DelegationRepository,
  workflowId: string,
  principalAccountId: string,
): Promise<LandedNode[]> {
  // Placed in dependency order, so the reverse puts every dependent before its dependencies.
  const rows = (await repo.workflowWorktrees(workflowId, principalAccountId))
    .filter((r) => r.committedCommit)
    .reverse();
  if (rows.length === 0)
    throw coded("nothing_to_land", `workflow ${workflowId} has no committed isolated node`);
  const landed: LandedNode[] = [];
  for (const r of rows) {
    if (!r.startedFromBranch)
      throw coded(
        "detached_head",
        `node ${r.node?.nodeId} started on a detached HEAD: no branch to land into`,
      );
    const out = await landBranch({ repoDir: r.repoRoot, branch: r.branch, into: r.startedFromBranch });
    await repo.recordWorktreeCommit(r.sessionId, principalAccountId, "landed", out.after);
    landed.push({
      nodeId: r.node?.nodeId ?? "",
      branch: r.branch,
      into: out.into,
      after: out.after,
      fastForward: out.fastForward,
      alreadyLanded: out.alreadyLanded,
      changedPaths: out.changedPaths,
    });
  }
  return landed;
}
