export { type CommitLeftoversOptions, commitLeftovers, type LeftoversCommit } from "./commit.js";
export {
  type CreateIsolatedWorktreeOptions,
  createIsolatedWorktree,
  type IsolatedWorktree,
  type WorktreeBase,
} from "./create.js";
export { type ChangedFileStatus, changedPaths, type DiffStat, type DiffStatFile, diffStat } from "./diff.js";
export { WorkspaceError, type WorkspaceErrorCode } from "./errors.js";
export { CRW_GIT_IDENTITY } from "./git.js";
export { type LandBranchOptions, type Landed, landBranch } from "./land.js";
export { type CombinedCommit, combineCommits } from "./merge.js";
export { type RemoveIsolatedWorktreeOptions, removeIsolatedWorktree } from "./remove.js";
