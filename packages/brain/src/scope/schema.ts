import { z } from "zod";
import { isCanonicalArtifactPath, normalizePlacement } from "./paths.js";
import { TOOL_ENTRY_PATTERN } from "./tools.js";

/**
 * The normalizer's bounds. Capture does no I/O and its work is linear in these: a scope beyond them is
 * refused, never truncated.
 */
export const SCOPE_LIMITS = {
  toolEntries: 256,
  sharedArtifacts: 64,
  idLength: 256,
  pathLength: 4096,
  roleLength: 128,
  contextLength: 16_384,
  canonicalBytes: 65_536,
} as const;

const id = z.string().min(1).max(SCOPE_LIMITS.idLength);
const toolEntry = z.string().regex(TOOL_ENTRY_PATTERN, "not a tool pattern: Name or Name(argument glob)");

/** Where a child runs: a host project (`ref: null` is the nameless admin-only host target), a managed guest, or a paired local computer. */
export const ExecutionTargetSchema = z.discriminatedUnion("kind", [
  z.strictObject({ kind: z.literal("host"), ref: id.nullable() }),
  z.strictObject({
    kind: z.literal("managed"),
    ref: id,
    root: z.string().min(1).max(SCOPE_LIMITS.pathLength),
  }),
  z.strictObject({ kind: z.literal("local"), targetId: id }),
]);
export type ExecutionTarget = z.infer<typeof ExecutionTargetSchema>;

/** Ordered from narrowest to widest; a capture keeps the narrower of two. */
export const PERMISSION_BOUNDARIES = ["read-only", "workspace-write", "full-access"] as const;
export const PermissionBoundarySchema = z.enum(PERMISSION_BOUNDARIES);
export type PermissionBoundary = z.infer<typeof PermissionBoundarySchema>;

/** Host-minted marker of a memory-dreaming child. Never authority over the account by itself. */
export const DreamMarkerSchema = z.strictObject({ runId: id, accountUserId: id });
export type DreamMarker = z.infer<typeof DreamMarkerSchema>;

export const ToolListsSchema = z.strictObject({
  allow: z.array(toolEntry).max(SCOPE_LIMITS.toolEntries).optional(),
  deny: z.array(toolEntry).max(SCOPE_LIMITS.toolEntries).default([]),
});

const scopeShape = {
  version: z.literal(1).default(1),
  /** The principal account the child acts for. */
  accountId: id,
  /** The captured operator flag (owner or additional administrator, proven by the host at capture). */
  operator: z.boolean().default(false),
  target: ExecutionTargetSchema,
  projectRef: id.nullable().default(null),
  workDir: z.string().min(1).max(SCOPE_LIMITS.pathLength).nullable().default(null),
  tools: ToolListsSchema.default({ deny: [] }),
  permissionBoundary: PermissionBoundarySchema.default("workspace-write"),
  readOnly: z.boolean().default(false),
  /** Role and context appended to a fresh worker's prompt. */
  role: z.string().min(1).max(SCOPE_LIMITS.roleLength).optional(),
  context: z.string().max(SCOPE_LIMITS.contextLength).optional(),
  sharedArtifacts: z
    .array(z.string().min(1).max(SCOPE_LIMITS.pathLength))
    .max(SCOPE_LIMITS.sharedArtifacts)
    .optional(),
  /** A fork child continues its parent's prefix instead of a fresh worker prompt. */
  fork: z.boolean().optional(),
  dream: DreamMarkerSchema.optional(),
};

/**
 * The durable `DelegatedExecutionScope`: captured once before dispatch, stored as canonical JSON, only ever
 * narrowed afterwards. Checks run in the seed's order: the target, then projectRef, then workDir against
 * the target's path rules, then each shared artifact's exact canonical spelling.
 */
export const DelegatedExecutionScopeSchema = z.strictObject(scopeShape).superRefine((scope, ctx) => {
  if (scope.target.kind === "managed") {
    const root = normalizePlacement(scope.target.root, "managed");
    if (!root.ok || root.path !== scope.target.root) {
      ctx.addIssue({
        code: "custom",
        path: ["target", "root"],
        message: "managed root must be a canonical POSIX path",
      });
    }
  }
  if (scope.projectRef !== null && scope.target.kind === "host" && scope.target.ref !== null) {
    if (scope.projectRef !== scope.target.ref) {
      ctx.addIssue({
        code: "custom",
        path: ["projectRef"],
        message: "projectRef differs from the host target's ref",
      });
      return;
    }
  }
  if (scope.workDir !== null) {
    const placed = normalizePlacement(scope.workDir, scope.target.kind);
    if (!placed.ok) ctx.addIssue({ code: "custom", path: ["workDir"], message: placed.reason });
    else if (placed.path !== scope.workDir) {
      ctx.addIssue({
        code: "custom",
        path: ["workDir"],
        message: `workDir is not normalized (${placed.path})`,
      });
    }
  }
  for (const [i, artifact] of (scope.sharedArtifacts ?? []).entries()) {
    if (!isCanonicalArtifactPath(artifact)) {
      ctx.addIssue({
        code: "custom",
        path: ["sharedArtifacts", i],
        message: "artifact path is not in canonical form",
      });
    }
  }
  if (scope.dream && scope.dream.accountUserId !== scope.accountId) {
    ctx.addIssue({
      code: "custom",
      path: ["dream", "accountUserId"],
      message: "dream names another account",
    });
  }
});

export type DelegatedExecutionScope = z.output<typeof DelegatedExecutionScopeSchema>;
/** What a host passes to capture: defaults fill the optional members. */
export type DelegatedExecutionScopeInput = z.input<typeof DelegatedExecutionScopeSchema>;

/**
 * The current access of whoever creates or continues a child, supplied by the host from live account
 * grants. Every member narrows; `dream` is how the host (and only the host) mints a dream child.
 */
export const DelegationAuthoritySchema = z.strictObject({
  accountId: id,
  operator: z.boolean().default(false),
  tools: z
    .strictObject({
      allow: z.array(toolEntry).max(SCOPE_LIMITS.toolEntries).optional(),
      deny: z.array(toolEntry).max(SCOPE_LIMITS.toolEntries).optional(),
    })
    .optional(),
  permissionBoundary: PermissionBoundarySchema.optional(),
  readOnly: z.boolean().optional(),
  target: ExecutionTargetSchema.optional(),
  dream: DreamMarkerSchema.optional(),
});
export type DelegationAuthority = z.input<typeof DelegationAuthoritySchema>;
export type ResolvedDelegationAuthority = z.output<typeof DelegationAuthoritySchema>;
