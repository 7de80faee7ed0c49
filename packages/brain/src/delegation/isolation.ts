import { createHash } from "node:crypto";
import { join, relative } from "node:path";
import type { DelegationRepository, NewIsolatedWorktree, SessionRow } from "@crw/db";
import { delegatedWorkDir, type WorkDirPlacement, type WorkDirPolicy } from "../scope/workdir.js";
import { commitLeftovers } from "../workspace/commit.js";
import { createIsolatedWorktree } from "../workspace/create.js";
import { type DiffStat, diffStat } from "../workspace/diff.js";
import { type Landed, landBranch } from "../workspace/land.js";
import { removeIsolatedWorktree } from "../workspace/remove.js";
import { DelegationError, toError } from "./errors.js";

/** How a child shares its parent's files: in place (the default), or in a git worktree of its own. */
export type Isolation = "none" | "worktree";

/**
 * A name for the child's worktree and branch that the same tool call always gets, so a retried call (after
 * a crash between making the worktree and recording the child) finds its worktree instead of a second one.
 */
export function isolationKey(parentSessionId: string, toolCallId: string): string {
  return createHash("sha256").update(`${parentSessionId}\n${toolCallId}`).digest("hex").slice(0, 12);
}

/**
 * The isolated child's placement: a worktree on branch `crw/<key>` made from the HEAD of the repository
 * around the parent's placement, the child working at the same place inside it. Made before the child row
 * (its directory must exist to be placed); the row records it in the child's own transaction.
 */
export async function isolatedPlacement(
  placement: WorkDirPlacement | null,
  key: string,
  worktreesDir: string | undefined,
  policy: WorkDirPolicy,
): Promise<{ placement: WorkDirPlacement; worktree: NewIsolatedWorktree }> {
  if (placement?.target.kind !== "host")
    throw new DelegationError("invalid_input", "isolation needs a working directory on this host", {});
  if (!worktreesDir)
    throw new DelegationError("invalid_input", "this host keeps no worktrees for isolated children", {});
  const made = await createIsolatedWorktree({
    repoDir: placement.workDir,
    worktreesDir,
    branch: `crw/${key}`,
    name: key,
    from: { head: true },
  });
  const inside = join(made.path, relative(made.repoRoot, placement.workDir));
  let placed: WorkDirPlacement;
  try {
    placed = await delegatedWorkDir(inside, policy);
  } catch (e) {
    // Refused (the parent's subdirectory is not in HEAD, say): the worktree made for it goes too.
    if (!made.reused) await removeIsolatedWorktree({ path: made.path, force: true }).catch(() => {});
    throw e;
  }
  return {
    placement: placed,
    worktree: {
      repoRoot: made.repoRoot,
      path: made.path,
      branch: made.branch,
      baseCommit: made.baseCommit,
      startedFromBranch: made.startedFromBranch,
    },
  };
}

/**
 * What an isolated child left, committed by crw (the child never runs git) before its result settles, and
 * the line its result carries: the branch, the commit and the paths. Idempotent: a settlement retried after
 * a crash commits nothing twice. Empty for a child without a worktree.
 */
export async function commitIsolatedWork(
  repo: DelegationRepository,
  child: SessionRow,
  task: string,
): Promise<string> {
  const row = await repo.isolatedWorktree(child.id, child.principalAccountId);
  if (!row) return "";
  const subject = task.split("\n")[0]?.slice(0, 60) ?? "";
  let done: Awaited<ReturnType<typeof commitLeftovers>>;
  try {
    done = await commitLeftovers({
      worktree: { path: row.path, branch: row.branch },
      message: `crw: work of child ${child.id.slice(0, 8)}: ${subject}`,
    });
  } catch (e) {
    // Landing takes only what is committed on the branch: the result says where the work waits and how on.
    return `\n\n[crw] the work in the child's worktree could not be committed: ${toError(e).message}\n[crw] it stays uncommitted in ${row.path} (branch ${row.branch}): commit it there, then land it with 'crw session land ${child.id}'`;
  }
  await repo.recordWorktreeCommit(child.id, child.principalAccountId, "committed", done.commit);
  const all = await diffStat(row.repoRoot, row.baseCommit, done.commit);
  const paths = all.files.map((f) => f.path);
  const listed = paths.length > 8 ? `${paths.slice(0, 8).join(", ")}, …` : paths.join(", ");
  return paths.length === 0
    ? `\n\n[crw] isolated on branch ${row.branch}: no changes`
    : `\n\n[crw] committed on branch ${row.branch} at ${done.commit.slice(0, 12)} (${all.summary}: ${listed}); land it with 'crw session land ${child.id}'`;
}

/** A landed isolated child: what moved, and the diff of what landed. */
export interface LandedWork extends Landed {
  readonly branch: string;
  readonly diff: DiffStat;
}

/** Merges an isolated child's branch into the branch its work started from: fast-forward or merge, never force. */
export async function landIsolatedWork(repo: DelegationRepository, child: SessionRow): Promise<LandedWork> {
  const row = await repo.isolatedWorktree(child.id, child.principalAccountId);
  if (!row)
    throw new DelegationError("invalid_input", `child ${child.id} has no isolated worktree to land`, {
      sessionId: child.id,
    });
  if (!row.startedFromBranch)
    throw new DelegationError(
      "invalid_input",
      "the work started on a detached HEAD: there is no branch to land into",
      {
        sessionId: child.id,
        branch: row.branch,
      },
    );
  const landed = await landBranch({ repoDir: row.repoRoot, branch: row.branch, into: row.startedFromBranch });
  await repo.recordWorktreeCommit(child.id, child.principalAccountId, "landed", landed.after);
  return { ...landed, branch: row.branch, diff: await diffStat(row.repoRoot, landed.before, landed.after) };
}
