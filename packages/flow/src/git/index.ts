export { CRW_IDENTITY, type GitErrorCode, type GitResult, GitWorkspaceError, git, gitRun } from "./exec.js";
export {
  compareHead,
  type ExecutorHeadMoved,
  type HeadCheck,
  keepStray,
  pendingTree,
  recordExecutorHead,
  type StrayKept,
  strayHeadForTree,
  strayRef,
} from "./stray.js";
export {
  checkoutDigest,
  outsideDigest,
  sharedDigest,
  type TraceDigests,
  type TraceWarning,
  type TraceWarningKind,
  takeTraceDigests,
  traceWarnings,
} from "./trace.js";
export {
  commonDir,
  ensureWorktree,
  headOf,
  removeWorktree,
  type WorktreeAllocation,
  worktreePath,
} from "./worktree.js";
