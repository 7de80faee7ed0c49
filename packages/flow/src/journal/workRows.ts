import { z } from "zod";

/**
 * The rows of a run's work product, when the run's repository is a git checkout: the run branch, each
 * executor call's commit, and the merges that join parallel calls' commits. The branch's refs are derived
 * from these rows (a resumed process moves them to where the rows say), so a ref is never the only record.
 */

const base = { seq: z.number().int().nonnegative(), at: z.string() };
const sha = z.string().regex(/^[0-9a-f]{40,64}$/);

/** What a call changed: the commit its checkout started at, crw's commit of its changes, the paths. */
export const CallWorkSchema = z.object({
  start: sha,
  /** null: the call changed nothing (or its role does not write), so nothing was committed. */
  commit: sha.nullable(),
  paths: z.array(z.string()),
});
export type CallWork = z.infer<typeof CallWorkSchema>;

/** The run's branch, made once at the commit the run started on; `from` is the branch checked out then. */
export const RunBranchRow = z.object({
  ...base,
  type: z.literal("run_branch"),
  branch: z.string(),
  base: sha,
  /** The branch (short name) the repository had checked out when the run started; null: a detached HEAD. */
  from: z.string().nullable(),
});

/**
 * The intent of crw's commit of an executor call: the commit object exists (made from the call's pending
 * tree on its start), and the worktree's HEAD is moved to it only after this row. A resumed call that finds
 * it takes the commit as its own instead of a subagent's, and commits nothing a second time.
 */
export const CommitIntendedRow = z.object({
  ...base,
  type: z.literal("commit_intended"),
  call: z.string(),
  op: z.string(),
  attempt: z.number().int().positive(),
  commit: sha,
  parent: sha,
  /** The worktree's HEAD when the commit was made (a subagent's own commit when it is not `parent`). */
  observed_head: sha,
  tree: sha,
  paths: z.array(z.string()),
});

/** The merge of the branch's open heads (parallel calls' commits) that the next call starts from. */
export const BranchMergedRow = z.object({
  ...base,
  type: z.literal("branch_merged"),
  /** The call that needed the merge; null: the run's end. */
  for_call: z.string().nullable(),
  heads: z.array(sha),
  commit: sha,
});

/** Open heads that could not be merged at the run's end: the branch stays at its first head. */
export const BranchUnmergedRow = z.object({
  ...base,
  type: z.literal("branch_unmerged"),
  heads: z.array(sha),
  paths: z.array(z.string()),
});
