import { describe, expect, it } from "vitest";
import {
  captureDelegatedExecutionScope,
  continuationScope,
  DelegatedScopeError,
  delegatedScopeFromAccess,
  narrowerBoundary,
  parseDelegatedExecutionScope,
  SCOPE_LIMITS,
  sameTarget,
  scopeExceedsCurrentAccess,
} from "../../src/scope/index.js";

/**
 * The edges of scope capture beyond capture.test.ts: the refusals' codes, messages and context, the size
 * bound at its exact limit, the target and operator rules of the narrowing, and the excess check's reasons.
 */
const base = {
  accountId: "acct-1",
  target: { kind: "host", ref: "proj-a" },
  projectRef: "proj-a",
  workDir: "/srv/proj-a",
};

function refusal(fn: () => unknown): DelegatedScopeError {
  try {
    fn();
  } catch (e) {
    if (e instanceof DelegatedScopeError) return e;
    throw e;
  }
  throw new Error("expected a DelegatedScopeError, nothing was thrown");
}

const scopeOf = (json: string) => parseDelegatedExecutionScope(json);

describe("capture refusals", () => {
  it("a scope that is not an object is refused at the root, its issues in the context", () => {
    const e = refusal(() => captureDelegatedExecutionScope("scope"));
    expect(e.code).toBe("invalid_scope");
    expect(e.message).toMatch(/^delegated execution scope is invalid: \(root\): \S/);
    const issues = e.context.issues as { path: string; message: string }[];
    expect(issues).toHaveLength(1);
    expect(issues[0]?.path).toBe("");
    expect(e.message).toBe(`delegated execution scope is invalid: (root): ${issues[0]?.message}`);
  });

  it("every issue is named by its dotted path, joined in one message", () => {
    const e = refusal(() =>
      captureDelegatedExecutionScope({ ...base, accountId: "", tools: { allow: ["ok", "not ok"] } }),
    );
    expect(e.code).toBe("invalid_scope");
    const issues = e.context.issues as { path: string; message: string }[];
    expect(issues.map((i) => i.path)).toEqual(["accountId", "tools.allow.1"]);
    expect(e.message).toBe(
      `delegated execution scope is invalid: accountId: ${issues[0]?.message}; tools.allow.1: ${issues[1]?.message}`,
    );
  });

  it("one limit exceeded among other issues makes the whole refusal scope_limit_exceeded", () => {
    const many = Array.from({ length: SCOPE_LIMITS.toolEntries + 1 }, (_, i) => `Tool${i}`);
    const e = refusal(() =>
      captureDelegatedExecutionScope({ ...base, readOnly: "yes", tools: { allow: many } }),
    );
    expect(e.code).toBe("scope_limit_exceeded");
    expect((e.context.issues as unknown[]).length).toBe(2);
  });

  it("an authority that does not validate is refused as invalid_authority with its issues", () => {
    const e = refusal(() => captureDelegatedExecutionScope(base, { accountId: "" }));
    expect(e.code).toBe("invalid_authority");
    expect(e.message).toBe("delegation authority is invalid");
    expect((e.context.issues as { path: string }[]).map((i) => i.path)).toEqual(["accountId"]);
  });

  it("a scope holding something that is not plain data is refused before validation", () => {
    const e = refusal(() => captureDelegatedExecutionScope({ ...base, callback: () => 1 }));
    expect(e.code).toBe("invalid_scope");
    expect(e.message).toBe("delegated execution scope is not plain data");
  });

  it("a scope of another account names both accounts", () => {
    const e = refusal(() => captureDelegatedExecutionScope(base, { accountId: "acct-2" }));
    expect(e.code).toBe("invalid_authority");
    expect(e.message).toBe("scope names another account than its authority");
    expect(e.context).toEqual({ scopeAccount: "acct-1", authorityAccount: "acct-2" });
  });

  it("a dream the authority did not mint is refused with its own message", () => {
    const e = refusal(() =>
      captureDelegatedExecutionScope({ ...base, dream: { runId: "d", accountUserId: "acct-1" } }),
    );
    expect(e.code).toBe("dream_not_host_minted");
    expect(e.message).toBe("a dream marker is host-only: the authority does not mint this one");
  });

  it("a dream minted by the authority is not grafted onto something that is not an object", () => {
    const dream = { runId: "d", accountUserId: "acct-1" };
    for (const raw of ["scope", null]) {
      const e = refusal(() => captureDelegatedExecutionScope(raw, { accountId: "acct-1", dream }));
      expect(e.code).toBe("invalid_scope");
      expect(e.message).toMatch(/^delegated execution scope is invalid: \(root\): /);
      expect(e.context.issues).toHaveLength(1);
    }
  });

  it("stored scopes are refused as stored scopes: not JSON, or invalid", () => {
    const notJson = refusal(() => parseDelegatedExecutionScope("{not json"));
    expect(notJson.code).toBe("invalid_scope");
    expect(notJson.message).toBe("stored scope is not JSON");
    const invalid = refusal(() => parseDelegatedExecutionScope(JSON.stringify({ accountId: "acct-1" })));
    expect(invalid.message).toMatch(/^stored scope is invalid: target: /);
  });
});

describe("the canonical size bound", () => {
  /** Artifacts that bring the canonical text to exactly `bytes`. */
  function scopeOfSize(bytes: number) {
    const artifacts = Array.from(
      { length: 16 },
      (_, i) => `/p${String(i).padStart(2, "0")}/${"x".repeat(4000)}`,
    );
    const size = Buffer.byteLength(captureDelegatedExecutionScope({ ...base, sharedArtifacts: artifacts }));
    // one more artifact adds its text, two quotes and a comma
    const last = `/z/${"y".repeat(bytes - size - 3 - 3)}`;
    return { ...base, sharedArtifacts: [...artifacts, last] };
  }

  it("a scope of exactly the limit is accepted, one byte more is refused", () => {
    const atLimit = captureDelegatedExecutionScope(scopeOfSize(SCOPE_LIMITS.canonicalBytes));
    expect(Buffer.byteLength(atLimit)).toBe(SCOPE_LIMITS.canonicalBytes);
    const e = refusal(() => captureDelegatedExecutionScope(scopeOfSize(SCOPE_LIMITS.canonicalBytes + 1)));
    expect(e.code).toBe("scope_limit_exceeded");
    expect(e.message).toBe(`scope is larger than ${SCOPE_LIMITS.canonicalBytes} bytes`);
  });

  it("shared artifacts are stored once each, sorted", () => {
    const scope = scopeOf(captureDelegatedExecutionScope({ ...base, sharedArtifacts: ["/b", "/a", "/b"] }));
    expect(scope.sharedArtifacts).toEqual(["/a", "/b"]);
  });
});

describe("narrowing by the authority", () => {
  it("the narrower of two boundaries, and the scope's own without an authority boundary", () => {
    expect(narrowerBoundary("full-access", undefined)).toBe("full-access");
    expect(narrowerBoundary("read-only", "full-access")).toBe("read-only");
    expect(narrowerBoundary("full-access", "workspace-write")).toBe("workspace-write");
    expect(narrowerBoundary("workspace-write", "read-only")).toBe("read-only");
    expect(narrowerBoundary("workspace-write", "workspace-write")).toBe("workspace-write");
  });

  it("targets are the same only when every member is", () => {
    expect(sameTarget({ kind: "host", ref: "a" }, { kind: "host", ref: "a" })).toBe(true);
    expect(sameTarget({ kind: "host", ref: "a" }, { kind: "host", ref: null })).toBe(false);
    expect(
      sameTarget({ kind: "managed", ref: "m", root: "/g" }, { kind: "managed", ref: "m", root: "/h" }),
    ).toBe(false);
  });

  it("a scope keeps its narrower boundary under a wider authority, and stays writable", () => {
    const scope = scopeOf(
      captureDelegatedExecutionScope(
        { ...base, permissionBoundary: "workspace-write" },
        { accountId: "acct-1", permissionBoundary: "full-access" },
      ),
    );
    expect(scope.permissionBoundary).toBe("workspace-write");
    expect(scope.readOnly).toBe(false);
  });

  it("read-only comes from the scope or from the authority, never from nothing", () => {
    const plain = scopeOf(captureDelegatedExecutionScope(base, { accountId: "acct-1" }));
    expect(plain.readOnly).toBe(false);
    const notReadOnly = scopeOf(
      captureDelegatedExecutionScope(base, { accountId: "acct-1", readOnly: false }),
    );
    expect(notReadOnly.readOnly).toBe(false);
    const fromScope = scopeOf(
      captureDelegatedExecutionScope({ ...base, readOnly: true }, { accountId: "acct-1" }),
    );
    expect(fromScope.readOnly).toBe(true);
    expect(fromScope.permissionBoundary).toBe("workspace-write");
    const fromAuthority = scopeOf(
      captureDelegatedExecutionScope(base, { accountId: "acct-1", readOnly: true }),
    );
    expect(fromAuthority.readOnly).toBe(true);
  });

  it("the operator flag needs both the scope and the authority", () => {
    const asked = scopeOf(captureDelegatedExecutionScope(base, { accountId: "acct-1", operator: true }));
    expect(asked.operator).toBe(false);
  });

  it("the authority's allow-list and denials apply to a scope that names none", () => {
    const scope = scopeOf(
      captureDelegatedExecutionScope(base, {
        accountId: "acct-1",
        tools: { allow: ["Write", "Read", "Read"], deny: ["Bash"] },
      }),
    );
    expect(scope.tools).toEqual({ allow: ["Read", "Write"], deny: ["Bash"] });
  });

  it("the same target as the authority's is accepted; another is refused, naming the scope's target", () => {
    const same = scopeOf(
      captureDelegatedExecutionScope(base, { accountId: "acct-1", target: { kind: "host", ref: "proj-a" } }),
    );
    expect(same.target).toEqual({ kind: "host", ref: "proj-a" });
    const e = refusal(() =>
      captureDelegatedExecutionScope(base, { accountId: "acct-1", target: { kind: "host", ref: "proj-b" } }),
    );
    expect(e.code).toBe("invalid_authority");
    expect(e.message).toBe("scope target differs from the caller's target");
    expect(e.context).toEqual({ target: { kind: "host", ref: "proj-a" } });
  });

  it("an operator's host child may name another host ref; no other pair of targets may differ", () => {
    const admin = scopeOf(
      captureDelegatedExecutionScope(
        { ...base, operator: true },
        { accountId: "acct-1", operator: true, target: { kind: "host", ref: "proj-b" } },
      ),
    );
    expect(admin.target).toEqual({ kind: "host", ref: "proj-a" });
    expect(admin.operator).toBe(true);
    const managed = {
      accountId: "acct-1",
      target: { kind: "managed", ref: "m1", root: "/guest" },
      workDir: "/guest/w",
    };
    const refused: [unknown, Parameters<typeof captureDelegatedExecutionScope>[1]][] = [
      [base, { accountId: "acct-1", operator: false, target: { kind: "host", ref: "proj-b" } }],
      [managed, { accountId: "acct-1", operator: true, target: { kind: "host", ref: "proj-a" } }],
      [base, { accountId: "acct-1", operator: true, target: { kind: "managed", ref: "m1", root: "/guest" } }],
      [
        managed,
        { accountId: "acct-1", operator: true, target: { kind: "managed", ref: "m2", root: "/guest" } },
      ],
    ];
    for (const [scope, authority] of refused) {
      expect(refusal(() => captureDelegatedExecutionScope(scope, authority)).code).toBe("invalid_authority");
    }
  });
});

describe("continuations and the access descriptor", () => {
  it("a continuation never takes a dream from its caller", () => {
    const stored = captureDelegatedExecutionScope(base);
    const caller = { accountId: "acct-1", dream: { runId: "d", accountUserId: "acct-1" } };
    const cont = scopeOf(continuationScope(stored, caller));
    expect(cont.dream).toBeUndefined();
    expect(cont.accountId).toBe("acct-1");
  });

  it("a stored scope given as an object is read as a copy", () => {
    // A caller's own object (a parsed scope itself is frozen, so no caller can change one).
    const stored = structuredClone(
      scopeOf(captureDelegatedExecutionScope({ ...base, tools: { allow: ["Read"] } })),
    );
    const read = parseDelegatedExecutionScope(stored);
    expect(read).toEqual(stored);
    (stored.tools.allow as string[]).push("Write");
    expect(read.tools.allow).toEqual(["Read"]);
  });

  it("the descriptor carries every member it names, and no tools when it has none", () => {
    const access = {
      accountId: "acct-1",
      operator: true,
      target: { kind: "host", ref: "proj-a" } as const,
      projectRef: "proj-a",
      workDir: "/srv/proj-a",
      tools: { allow: ["Read"], deny: ["Write"] },
      permissionBoundary: "read-only" as const,
      readOnly: true,
      role: "reviewer",
      context: "look closely",
      sharedArtifacts: ["/a"],
      fork: true,
    };
    expect(delegatedScopeFromAccess(access)).toEqual(access);
    const bare = delegatedScopeFromAccess({ accountId: "acct-1", target: { kind: "host", ref: null } });
    expect(bare.tools).toBeUndefined();
    expect(scopeOf(captureDelegatedExecutionScope(delegatedScopeFromAccess(access)))).toMatchObject({
      ...access,
      version: 1,
    });
  });
});

describe("scopeExceedsCurrentAccess, reason by reason", () => {
  const stored = captureDelegatedExecutionScope({
    ...base,
    tools: { allow: ["Read", "Bash(git *)"], deny: [] },
  });
  const unrestricted = captureDelegatedExecutionScope(base);

  it("names each excess with its reason", () => {
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-2" })).toEqual({
      field: "account",
      reason: "scope belongs to another account",
    });
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", target: { kind: "host", ref: "proj-b" } }),
    ).toEqual({ field: "target", reason: "scope target differs from the current target" });
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { allow: ["Read"] } })).toEqual({
      field: "tools",
      reason: "an allow-list entry is not fully covered by current access",
    });
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Bash"] } })).toEqual({
      field: "deny",
      reason: "current access denies Bash",
    });
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", permissionBoundary: "read-only" }),
    ).toEqual({
      field: "permissionBoundary",
      reason: "scope's permission boundary is wider than current access",
    });
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", readOnly: true })).toEqual({
      field: "readOnly",
      reason: "current access is read-only",
    });
    const op = captureDelegatedExecutionScope({ ...base, operator: true });
    expect(scopeExceedsCurrentAccess(op, { accountId: "acct-1" })).toEqual({
      field: "operator",
      reason: "operator authority is no longer held",
    });
  });

  it("nothing is in excess when the scope asks for no more than current access holds", () => {
    const narrow = captureDelegatedExecutionScope({
      ...base,
      readOnly: true,
      permissionBoundary: "read-only",
      tools: { allow: ["Read"] },
    });
    expect(scopeExceedsCurrentAccess(narrow, { accountId: "acct-1" })).toBeUndefined();
    expect(
      scopeExceedsCurrentAccess(narrow, {
        accountId: "acct-1",
        readOnly: true,
        permissionBoundary: "read-only",
      }),
    ).toBeUndefined();
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", permissionBoundary: "full-access" }),
    ).toBeUndefined();
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", target: { kind: "host", ref: "proj-a" } }),
    ).toBeUndefined();
  });

  it("a denial counts against an unrestricted or a wildcard allow-list, not against an unrelated name", () => {
    expect(
      scopeExceedsCurrentAccess(unrestricted, { accountId: "acct-1", tools: { deny: ["Edit"] } }),
    ).toEqual({
      field: "deny",
      reason: "current access denies Edit",
    });
    const wild = captureDelegatedExecutionScope({ ...base, tools: { allow: ["Re*"] } });
    expect(
      scopeExceedsCurrentAccess(wild, { accountId: "acct-1", tools: { deny: ["Read(/etc/*)"] } })?.field,
    ).toBe("deny");
    expect(
      scopeExceedsCurrentAccess(wild, { accountId: "acct-1", tools: { deny: ["Write"] } }),
    ).toBeUndefined();
    // the stored scope already denies what current access denies: nothing more is asked for
    const denying = captureDelegatedExecutionScope({ ...base, tools: { deny: ["Bash(rm *)"] } });
    expect(
      scopeExceedsCurrentAccess(denying, { accountId: "acct-1", tools: { deny: ["Bash(rm *)"] } }),
    ).toBeUndefined();
  });

  it("an operator's host scope may differ from the current host ref; a non-operator's, a managed one's may not", () => {
    const hostB = captureDelegatedExecutionScope({ ...base, operator: true });
    expect(
      scopeExceedsCurrentAccess(hostB, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "host", ref: "x" },
      }),
    ).toBeUndefined();
    const managed = captureDelegatedExecutionScope({
      accountId: "acct-1",
      operator: true,
      target: { kind: "managed", ref: "m1", root: "/guest" },
      workDir: "/guest/w",
    });
    expect(
      scopeExceedsCurrentAccess(managed, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "host", ref: "x" },
      })?.field,
    ).toBe("target");
    expect(
      scopeExceedsCurrentAccess(hostB, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "managed", ref: "m1", root: "/guest" },
      })?.field,
    ).toBe("target");
    expect(
      scopeExceedsCurrentAccess(stored, {
        accountId: "acct-1",
        operator: false,
        target: { kind: "host", ref: "x" },
      })?.field,
    ).toBe("target");
  });
});
