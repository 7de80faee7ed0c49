import type { z } from "zod";
import { canonicalJson } from "./canonical.js";
import { DelegatedScopeError, type DelegatedScopeErrorCode } from "./errors.js";
import {
  type DelegatedExecutionScope,
  DelegatedExecutionScopeSchema,
  type DelegationAuthority,
  DelegationAuthoritySchema,
  type ExecutionTarget,
  PERMISSION_BOUNDARIES,
  type PermissionBoundary,
  type ResolvedDelegationAuthority,
  SCOPE_LIMITS,
} from "./schema.js";
import { frozenScope, isHandedOutScope, storedScopeOf } from "./storedScopes.js";
import { entryCovers, globMatches, intersectAllow, listCovers, parseToolEntry, unionDeny } from "./tools.js";

/** Canonical JSON text of a validated `DelegatedExecutionScope`, as stored in the session row. */
export type CanonicalScopeJson = string & { readonly __canonicalScope: true };

function fail(code: DelegatedScopeErrorCode, message: string, context: Record<string, unknown> = {}): never {
  throw new DelegatedScopeError(code, message, context);
}

function issuesOf(error: z.ZodError): { path: string; message: string }[] {
  return error.issues.map((issue) => ({ path: issue.path.join("."), message: issue.message }));
}

function parseScope(raw: unknown, what: string): DelegatedExecutionScope {
  const parsed = DelegatedExecutionScopeSchema.safeParse(raw);
  if (!parsed.success) {
    const issues = issuesOf(parsed.error);
    const tooBig = parsed.error.issues.some((issue) => issue.code === "too_big");
    fail(
      tooBig ? "scope_limit_exceeded" : "invalid_scope",
      `${what} is invalid: ${issues.map((i) => `${i.path || "(root)"}: ${i.message}`).join("; ")}`,
      { issues },
    );
  }
  return parsed.data;
}

function parseAuthority(raw: DelegationAuthority): ResolvedDelegationAuthority {
  const parsed = DelegationAuthoritySchema.safeParse(raw);
  if (!parsed.success)
    fail("invalid_authority", "delegation authority is invalid", { issues: issuesOf(parsed.error) });
  return parsed.data;
}

function toCanonical(scope: DelegatedExecutionScope): CanonicalScopeJson {
  const normal: DelegatedExecutionScope = {
    ...scope,
    tools: {
      ...(scope.tools.allow ? { allow: [...new Set(scope.tools.allow)].sort() } : {}),
      deny: unionDeny(scope.tools.deny),
    },
    ...(scope.sharedArtifacts ? { sharedArtifacts: [...new Set(scope.sharedArtifacts)].sort() } : {}),
  };
  const json = canonicalJson(normal);
  if (Buffer.byteLength(json) > SCOPE_LIMITS.canonicalBytes) {
    fail("scope_limit_exceeded", `scope is larger than ${SCOPE_LIMITS.canonicalBytes} bytes`);
  }
  return json as CanonicalScopeJson;
}

export function narrowerBoundary(
  a: PermissionBoundary,
  b: PermissionBoundary | undefined,
): PermissionBoundary {
  if (b === undefined) return a;
  return PERMISSION_BOUNDARIES.indexOf(a) <= PERMISSION_BOUNDARIES.indexOf(b) ? a : b;
}

export function sameTarget(a: ExecutionTarget, b: ExecutionTarget): boolean {
  return canonicalJson(a) === canonicalJson(b);
}

function sameDream(a: DelegatedExecutionScope["dream"], b: DelegatedExecutionScope["dream"]): boolean {
  return canonicalJson(a ?? null) === canonicalJson(b ?? null);
}

/**
 * Narrows a valid scope by current access: tool allow-lists intersect, denials union, the permission
 * boundary takes the narrower side, read-only sticks, the operator flag needs the authority's proof, and the
 * account must be the authority's own. Admin host refs may differ from the authority's host ref; every other
 * target must match exactly.
 */
function narrow(
  scope: DelegatedExecutionScope,
  authority: ResolvedDelegationAuthority,
): DelegatedExecutionScope {
  if (scope.accountId !== authority.accountId) {
    fail("invalid_authority", "scope names another account than its authority", {
      scopeAccount: scope.accountId,
      authorityAccount: authority.accountId,
    });
  }
  if (authority.target && !sameTarget(scope.target, authority.target)) {
    const adminHost = authority.operator && scope.target.kind === "host" && authority.target.kind === "host";
    if (!adminHost)
      fail("invalid_authority", "scope target differs from the caller's target", { target: scope.target });
  }
  const allow = intersectAllow(scope.tools.allow, authority.tools?.allow);
  const boundary = narrowerBoundary(scope.permissionBoundary, authority.permissionBoundary);
  return {
    ...scope,
    operator: scope.operator && authority.operator,
    tools: { ...(allow ? { allow } : {}), deny: unionDeny(scope.tools.deny, authority.tools?.deny) },
    permissionBoundary: boundary,
    readOnly: scope.readOnly || authority.readOnly === true || boundary === "read-only",
  };
}

/**
 * Captures a host-created child's durable scope before dispatch. Pure: validates the complete scope,
 * intersects its tool allow-list with the current grant, unions denials, and returns detached canonical
 * JSON. Missing authority adds no restriction; an explicit empty allow-list grants no tools; an invalid
 * scope throws `DelegatedScopeError`. A `dream` marker is accepted only when the authority carries the
 * same host-minted marker (the host is the only party that puts one there); a malformed one fails the
 * whole scope. Capture never composes prompts or tool catalogs.
 */
export function captureDelegatedExecutionScope(
  scope: unknown,
  authority?: DelegationAuthority,
): CanonicalScopeJson {
  const resolvedAuthority = authority === undefined ? undefined : parseAuthority(authority);
  let candidate: unknown = scope;
  // The host mints a dream by naming it in its authority; the scope may repeat it but never invent it.
  if (resolvedAuthority?.dream && typeof scope === "object" && scope !== null && !("dream" in scope)) {
    candidate = { ...scope, dream: resolvedAuthority.dream };
  }
  let detached: unknown;
  try {
    detached = structuredClone(candidate);
  } catch {
    fail("invalid_scope", "delegated execution scope is not plain data");
  }
  const parsed = parseScope(detached, "delegated execution scope");
  if (parsed.dream && !sameDream(parsed.dream, resolvedAuthority?.dream)) {
    fail("dream_not_host_minted", "a dream marker is host-only: the authority does not mint this one");
  }
  return toCanonical(resolvedAuthority ? narrow(parsed, resolvedAuthority) : parsed);
}

/**
 * Reads a stored scope back; anything malformed throws instead of granting a default. The scope is deeply
 * frozen and may be the same object another reader of the same text got (storedScopes.ts).
 */
export function parseDelegatedExecutionScope(
  stored: string | DelegatedExecutionScope,
): DelegatedExecutionScope {
  if (typeof stored === "string") return storedScopeOf(stored, parseStoredText);
  // A scope this function returned is parsed already, and frozen: it cannot have changed since.
  if (isHandedOutScope(stored)) return stored;
  return frozenScope(parseScope(structuredClone(stored), "stored scope"));
}

function parseStoredText(text: string): DelegatedExecutionScope {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    fail("invalid_scope", "stored scope is not JSON");
  }
  return parseScope(raw, "stored scope");
}

/**
 * An ordinary continuation's scope: the stored scope clamped to the caller's current grant (not the
 * verbatim check of journal replay). The dream marker survives the narrowing unchanged.
 */
export function continuationScope(
  stored: string | DelegatedExecutionScope,
  caller: DelegationAuthority,
): CanonicalScopeJson {
  const scope = parseDelegatedExecutionScope(stored);
  return toCanonical(narrow(scope, parseAuthority({ ...caller, dream: undefined })));
}

/**
 * The scope of a continuation requested from a read-only (plan mode) turn: the continuation clamp plus
 * read-only for the whole call. Bound to the exact tool-call row as `read_only_scope` by the delegation core.
 */
export function readOnlyContinuationScope(
  stored: string | DelegatedExecutionScope,
  caller: DelegationAuthority,
): CanonicalScopeJson {
  const scope = parseDelegatedExecutionScope(continuationScope(stored, caller));
  return toCanonical({ ...scope, readOnly: true, permissionBoundary: "read-only" });
}

export interface ScopeExcess {
  readonly field: "account" | "target" | "tools" | "deny" | "permissionBoundary" | "readOnly" | "operator";
  readonly reason: string;
}

/**
 * Whether a stored scope asks for more than the current access holds (DelegateContinue's comparison and
 * the journal replay check). Tools use verbatim mode: every stored allow entry must be entirely covered by
 * one current entry (`listCovers`); overlap is not enough. Returns the first excess, or `undefined`.
 * Admin host refs may differ from their host parent's ref; scoped and managed parents need the same target.
 */
export function scopeExceedsCurrentAccess(
  stored: string | DelegatedExecutionScope,
  current: DelegationAuthority,
): ScopeExcess | undefined {
  const scope = parseDelegatedExecutionScope(stored);
  const access = parseAuthority(current);
  if (scope.accountId !== access.accountId)
    return { field: "account", reason: "scope belongs to another account" };
  if (access.target && !sameTarget(scope.target, access.target)) {
    const adminHost = access.operator && scope.target.kind === "host" && access.target.kind === "host";
    if (!adminHost) return { field: "target", reason: "scope target differs from the current target" };
  }
  if (!listCovers(access.tools?.allow, scope.tools.allow)) {
    return { field: "tools", reason: "an allow-list entry is not fully covered by current access" };
  }
  // A current denial matters only where the stored allow-list could reach it.
  const uncovered = (access.tools?.deny ?? []).find(
    (d) => allowMayReach(scope.tools.allow, d) && !scope.tools.deny.some((s) => entryCovers(s, d)),
  );
  if (uncovered !== undefined) return { field: "deny", reason: `current access denies ${uncovered}` };
  if (narrowerBoundary(scope.permissionBoundary, access.permissionBoundary) !== scope.permissionBoundary) {
    return {
      field: "permissionBoundary",
      reason: "scope's permission boundary is wider than current access",
    };
  }
  if (access.readOnly && !scope.readOnly) return { field: "readOnly", reason: "current access is read-only" };
  if (scope.operator && !access.operator)
    return { field: "operator", reason: "operator authority is no longer held" };
  return undefined;
}

/**
 * Whether some call allowed by `allow` could be one `denyEntry` forbids. Exact for a literal tool name;
 * a wildcard name is assumed reachable (the check may refuse more, never less).
 */
function allowMayReach(allow: readonly string[] | undefined, denyEntry: string): boolean {
  if (allow === undefined) return true;
  const deny = parseToolEntry(denyEntry);
  if (!deny || deny.name.includes("*")) return true;
  return allow.some((entry) => {
    const parsed = parseToolEntry(entry);
    return parsed !== undefined && globMatches(parsed.name, deny.name);
  });
}

/** What the Delegate tool and plugin paths know about the caller: there is deliberately no dream here. */
export interface DelegatedAccessDescriptor {
  readonly accountId: string;
  readonly operator?: boolean;
  readonly target: ExecutionTarget;
  readonly projectRef?: string | null;
  readonly workDir?: string | null;
  readonly tools?: { readonly allow?: readonly string[]; readonly deny?: readonly string[] };
  readonly permissionBoundary?: PermissionBoundary;
  readonly readOnly?: boolean;
  readonly role?: string;
  readonly context?: string;
  readonly sharedArtifacts?: readonly string[];
  readonly fork?: boolean;
}

/**
 * Builds a scope input field by field from an access descriptor. Members it does not name (a smuggled
 * `dream` included) never reach the scope, so no model input can name a dream.
 */
export function delegatedScopeFromAccess(access: DelegatedAccessDescriptor): Record<string, unknown> {
  return {
    accountId: access.accountId,
    operator: access.operator,
    target: access.target,
    projectRef: access.projectRef,
    workDir: access.workDir,
    tools: access.tools ? { allow: access.tools.allow, deny: access.tools.deny } : undefined,
    permissionBoundary: access.permissionBoundary,
    readOnly: access.readOnly,
    role: access.role,
    context: access.context,
    sharedArtifacts: access.sharedArtifacts,
    fork: access.fork,
  };
}
