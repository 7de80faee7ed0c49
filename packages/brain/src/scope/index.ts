export { canonicalJson } from "./canonical.js";
export {
  type CanonicalScopeJson,
  captureDelegatedExecutionScope,
  continuationScope,
  type DelegatedAccessDescriptor,
  delegatedScopeFromAccess,
  narrowerBoundary,
  parseDelegatedExecutionScope,
  readOnlyContinuationScope,
  type ScopeExcess,
  sameTarget,
  scopeExceedsCurrentAccess,
} from "./capture.js";
export { DelegatedScopeError, type DelegatedScopeErrorCode } from "./errors.js";
export { type DelegatedTurnIdentity, forDelegatedTurn, type ParentSessionFacts } from "./identity.js";
export {
  eligibleInstructionFiles,
  INSTRUCTION_FILE,
  INSTRUCTION_LIMITS,
  type InstructionFile,
  instructionRootFor,
  instructionSection,
  RULES_DIR,
} from "./instructions.js";
export { isCanonicalArtifactPath, normalizePlacement, type PathSpelling, pathSpelling } from "./paths.js";
export {
  type DelegatedExecutionScope,
  type DelegatedExecutionScopeInput,
  DelegatedExecutionScopeSchema,
  type DelegationAuthority,
  DelegationAuthoritySchema,
  type DreamMarker,
  type ExecutionTarget,
  PERMISSION_BOUNDARIES,
  type PermissionBoundary,
  SCOPE_LIMITS,
} from "./schema.js";
export {
  entryCovers,
  globCovers,
  globMatches,
  intersectAllow,
  listCovers,
  parseToolEntry,
  type ToolCallVerdict,
  type ToolLists,
  toolCallVerdict,
  unionDeny,
} from "./tools.js";
export {
  admitStoredWorkDir,
  delegatedWorkDir,
  type HostProject,
  type ProjectContext,
  projectContextRoot,
  type WorkDirPlacement,
  type WorkDirPolicy,
} from "./workdir.js";
