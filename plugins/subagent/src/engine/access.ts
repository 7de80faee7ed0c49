import {
  captureDelegatedExecutionScope,
  type DelegatedExecutionScope,
  type DelegationAuthority,
  delegatedScopeFromAccess,
  type ExecutionTarget,
  intersectAllow,
  narrowerBoundary,
  type PermissionBoundary,
  parseDelegatedExecutionScope,
  scopeExceedsCurrentAccess,
  unionDeny,
  type WorkDirPlacement,
} from "@crw/brain";
import type { DelegationRepository } from "@crw/db";
import type { WorkflowNode } from "../definition/schema.js";
import { toError } from "../errors.js";
import type { OrchestrationJournal, OriginAccess } from "../journal/schema.js";
import { ownEntry } from "./own.js";

/** The origin turn's access as the host captures it (start and explicit resume). */
export interface OriginAccessInput {
  readonly accountId: string;
  readonly operator?: boolean;
  readonly target: ExecutionTarget;
  readonly projectRef?: string | null;
  readonly tools?: { readonly allow?: readonly string[]; readonly deny?: readonly string[] };
  readonly permissionBoundary?: PermissionBoundary;
  readonly readOnly?: boolean;
}

export function normalizeOriginAccess(input: OriginAccessInput): OriginAccess {
  return {
    accountId: input.accountId,
    operator: input.operator ?? false,
    target: structuredClone(input.target),
    projectRef: input.projectRef ?? null,
    tools: {
      ...(input.tools?.allow ? { allow: [...input.tools.allow] } : {}),
      deny: [...(input.tools?.deny ?? [])],
    },
    permissionBoundary: input.permissionBoundary ?? "workspace-write",
    readOnly: input.readOnly ?? false,
  };
}

export function authorityOf(access: OriginAccess): DelegationAuthority {
  return {
    accountId: access.accountId,
    operator: access.operator,
    tools: {
      ...(access.tools.allow ? { allow: [...access.tools.allow] } : {}),
      deny: [...access.tools.deny],
    },
    permissionBoundary: access.permissionBoundary,
    readOnly: access.readOnly,
  };
}

/** The origin's own access as a scope, so journal replay can compare it like any node's. */
export function originScope(access: OriginAccess): string {
  return captureDelegatedExecutionScope(
    delegatedScopeFromAccess({
      accountId: access.accountId,
      operator: access.operator,
      target: access.target as ExecutionTarget,
      projectRef:
        access.target && (access.target as ExecutionTarget).kind === "host"
          ? ((access.target as { ref: string | null }).ref ?? null)
          : access.projectRef,
      tools: access.tools,
      permissionBoundary: access.permissionBoundary,
      readOnly: access.readOnly,
    }),
  );
}

/**
 * The access a node's child is created with. A definition node starts from the origin's access; a node
 * added by another node (WorkflowAddNodes) starts from its spawning node's stored access, so target,
 * principal, managed root, read-only provenance and tool/permission restrictions carry over and the child
 * stays continuable under the same parent. The node's own restrictions then only narrow.
 */
export function captureNodeScope(
  journal: OrchestrationJournal,
  node: WorkflowNode,
  addedBy: string | undefined,
  placement: WorkDirPlacement | null,
): string {
  const spawning = addedBy ? ownEntry(journal.nodeAccess, addedBy) : undefined;
  const base: DelegatedExecutionScope | undefined = spawning
    ? parseDelegatedExecutionScope(spawning)
    : undefined;
  const origin = journal.origin.access;
  const accountId = base?.accountId ?? origin.accountId;
  const operator = base?.operator ?? origin.operator;
  const target = placement?.target ?? base?.target ?? (origin.target as ExecutionTarget);
  const boundary: PermissionBoundary = narrowerBoundary(
    base?.permissionBoundary ?? origin.permissionBoundary,
    node.readOnly ? "read-only" : undefined,
  );
  const heldAllow = base ? base.tools.allow : origin.tools.allow;
  const heldDeny = base ? base.tools.deny : origin.tools.deny;
  const readOnly = (base?.readOnly ?? origin.readOnly) || node.readOnly === true || boundary === "read-only";
  const scope = delegatedScopeFromAccess({
    accountId,
    operator,
    target,
    projectRef: placement
      ? placement.projectRef
      : (base?.projectRef ?? (target.kind === "host" ? target.ref : origin.projectRef)),
    workDir: placement?.workDir ?? base?.workDir ?? null,
    tools: {
      allow: intersectAllow(node.tools?.allow, heldAllow),
      deny: unionDeny(heldDeny, node.tools?.deny),
    },
    permissionBoundary: boundary,
    readOnly,
    role: node.role ?? node.agentType,
  });
  return captureDelegatedExecutionScope(scope, {
    accountId,
    operator,
    tools: { ...(heldAllow ? { allow: heldAllow } : {}), deny: heldDeny },
    permissionBoundary: boundary,
    readOnly,
  });
}

export type BoundaryVerdict = { readonly ok: true } | { readonly ok: false; readonly reason: string };

/**
 * The required `validateBoundary(access)` hook: one journaled scope (the parent's, or a node's) against the
 * current authority. Journal fields are only compared, never used to grant: verbatim tool mode
 * (`listCovers` through scopeExceedsCurrentAccess), so an allow entry that merely overlaps is refused.
 */
export type ValidateBoundary = (access: { subject: string; scope: string }) => Promise<BoundaryVerdict>;

export function boundaryAgainst(current: DelegationAuthority): ValidateBoundary {
  return async ({ scope }) => {
    try {
      const excess = scopeExceedsCurrentAccess(scope, current);
      return excess ? { ok: false, reason: `${excess.field}: ${excess.reason}` } : { ok: true };
    } catch (e) {
      return { ok: false, reason: `journaled scope is malformed: ${toError(e).message}` };
    }
  };
}

/**
 * WorkflowResumeRecovery.journaledBoundaryCheck's access: the origin session's current authority, derived
 * from current account grants and, for a delegated origin, its persisted scope and every durable ancestor's
 * (each must still fit the account: scopeExceedsCurrentAccess). Malformed scopes, ancestry cycles and
 * cross-account links refuse. Reads only; starts no turn and writes nothing.
 */
export async function currentDelegatedAccess(
  repo: Pick<DelegationRepository, "getAccount" | "getSession" | "ancestry" | "getProject">,
  principalAccountId: string,
  sessionId: string,
): Promise<
  { ok: true; authority: DelegationAuthority; target: ExecutionTarget | null } | { ok: false; reason: string }
> {
  try {
    const account = await repo.getAccount(principalAccountId);
    const session = await repo.getSession(sessionId, principalAccountId);
    const accountAuthority: DelegationAuthority = {
      accountId: account.id,
      // Owner authority comes from the account itself; a delegated origin must also carry it in its scope.
      operator: account.isOwner || account.isAdministrator,
      tools: { ...(account.toolAllow ? { allow: [...account.toolAllow] } : {}), deny: [...account.toolDeny] },
      permissionBoundary: boundaryFromSettings(account.permissionSettings),
    };
    if (session.kind === "root") return { ok: true, authority: accountAuthority, target: null };
    const chain = [session, ...(await repo.ancestry(sessionId, principalAccountId))];
    for (const s of chain) {
      if (s.kind === "root") continue;
      if (s.scope === null) return { ok: false, reason: `delegated session ${s.id} has no scope` };
      const excess = scopeExceedsCurrentAccess(s.scope, accountAuthority);
      if (excess) return { ok: false, reason: `session ${s.id} exceeds current access: ${excess.reason}` };
      const lost = await projectLost(repo, s.scope, account.id, accountAuthority.operator === true);
      if (lost) return { ok: false, reason: `session ${s.id} ${lost}` };
    }
    const own = parseDelegatedExecutionScope(session.scope ?? "");
    const allow = intersectAllow(own.tools.allow, account.toolAllow ?? undefined);
    return {
      ok: true,
      target: own.target,
      authority: {
        accountId: account.id,
        operator: own.operator && accountAuthority.operator === true,
        tools: { ...(allow ? { allow } : {}), deny: unionDeny(own.tools.deny, account.toolDeny) },
        permissionBoundary: narrowerBoundary(own.permissionBoundary, accountAuthority.permissionBoundary),
        readOnly: own.readOnly,
      },
    };
  } catch (e) {
    return { ok: false, reason: toError(e).message };
  }
}

/**
 * Why a stored scope's host project no longer holds for the account, or null: the project is gone, or (for an
 * account that is neither owner nor administrator) it is no longer granted to the account.
 */
async function projectLost(
  repo: Pick<DelegationRepository, "getProject">,
  stored: string,
  accountId: string,
  operator: boolean,
): Promise<string | null> {
  const scope = parseDelegatedExecutionScope(stored);
  const ref = scope.projectRef ?? (scope.target.kind === "host" ? scope.target.ref : null);
  if (ref === null) return null;
  const project = await repo.getProject(ref);
  if (!project) return `works in project ${ref}, which no longer exists`;
  if (!operator && !project.accounts.includes(accountId))
    return `works in project ${ref}, which is no longer granted to its account`;
  return null;
}

function boundaryFromSettings(settings: Readonly<Record<string, unknown>>): PermissionBoundary {
  const b = settings.permissionBoundary;
  return b === "read-only" || b === "workspace-write" || b === "full-access" ? b : "full-access";
}
