import type pg from "pg";
import { assertUuid } from "./rows.js";

/** What an isolated child's worktree row records (see the migration that makes `isolated_worktrees`). */
export interface IsolatedWorktreeRow {
  readonly sessionId: string;
  readonly repoRoot: string;
  readonly path: string;
  readonly branch: string;
  readonly baseCommit: string;
  readonly startedFromBranch: string | null;
  readonly committedCommit: string | null;
  readonly landedCommit: string | null;
  /** A workflow node's child: its workflow and node. */
  readonly node: { readonly workflowId: string; readonly nodeId: string } | null;
}

export type NewIsolatedWorktree = Omit<
  IsolatedWorktreeRow,
  "sessionId" | "committedCommit" | "landedCommit" | "node"
>;

interface Row {
  session_id: string;
  repo_root: string;
  path: string;
  branch: string;
  base_commit: string;
  started_from_branch: string | null;
  committed_commit: string | null;
  landed_commit: string | null;
  workflow_id: string | null;
  node_id: string | null;
}

const fromRow = (r: Row): IsolatedWorktreeRow => ({
  sessionId: r.session_id,
  repoRoot: r.repo_root,
  path: r.path,
  branch: r.branch,
  baseCommit: r.base_commit,
  startedFromBranch: r.started_from_branch,
  committedCommit: r.committed_commit,
  landedCommit: r.landed_commit,
  node: r.workflow_id && r.node_id ? { workflowId: r.workflow_id, nodeId: r.node_id } : null,
});

/** Inside the transaction that makes the child: its worktree is known from the child's first moment on. */
export async function insertIsolatedWorktree(
  c: pg.PoolClient,
  sessionId: string,
  principalAccountId: string,
  w: NewIsolatedWorktree,
): Promise<void> {
  await c.query(
    `insert into isolated_worktrees (session_id, principal_account_id, repo_root, path, branch, base_commit, started_from_branch)
     values ($1::uuid, $2::uuid, $3, $4, $5, $6, $7)`,
    [sessionId, principalAccountId, w.repoRoot, w.path, w.branch, w.baseCommit, w.startedFromBranch],
  );
}

/**
 * A workflow node's worktree, recorded once its child exists; again after a crash is a no-op (the node's
 * journal holds the same worktree until then).
 */
export async function addNodeWorktree(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  w: NewIsolatedWorktree,
  node: { workflowId: string; nodeId: string },
): Promise<void> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  assertUuid("workflowId", node.workflowId);
  await pool.query(
    `insert into isolated_worktrees
       (session_id, principal_account_id, repo_root, path, branch, base_commit, started_from_branch, workflow_id, node_id)
     values ($1::uuid, $2::uuid, $3, $4, $5, $6, $7, $8::uuid, $9) on conflict (session_id) do nothing`,
    [
      sessionId,
      principalAccountId,
      w.repoRoot,
      w.path,
      w.branch,
      w.baseCommit,
      w.startedFromBranch,
      node.workflowId,
      node.nodeId,
    ],
  );
}

/** A workflow's node worktrees, in the order their nodes were placed (dependencies before dependents). */
export async function workflowWorktrees(
  pool: pg.Pool,
  workflowId: string,
  principalAccountId: string,
): Promise<IsolatedWorktreeRow[]> {
  assertUuid("workflowId", workflowId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    `select * from isolated_worktrees where workflow_id = $1::uuid and principal_account_id = $2::uuid
      order by created_at, session_id`,
    [workflowId, principalAccountId],
  );
  return rows.map(fromRow);
}

export async function isolatedWorktree(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
): Promise<IsolatedWorktreeRow | null> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  const { rows } = await pool.query<Row>(
    "select * from isolated_worktrees where session_id = $1::uuid and principal_account_id = $2::uuid",
    [sessionId, principalAccountId],
  );
  return rows[0] ? fromRow(rows[0]) : null;
}

export async function recordWorktreeCommit(
  pool: pg.Pool,
  sessionId: string,
  principalAccountId: string,
  column: "committed_commit" | "landed_commit",
  commit: string,
): Promise<void> {
  assertUuid("sessionId", sessionId);
  assertUuid("principalAccountId", principalAccountId);
  await pool.query(
    `update isolated_worktrees set ${column} = $3 where session_id = $1::uuid and principal_account_id = $2::uuid`,
    [sessionId, principalAccountId, commit],
  );
}
