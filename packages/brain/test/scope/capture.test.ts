import { describe, expect, it, vi } from "vitest";
import { type MutatingTool, scopedTools } from "../../src/index.js";
import {
  canonicalJson,
  captureDelegatedExecutionScope,
  continuationScope,
  DelegatedScopeError,
  delegatedScopeFromAccess,
  parseDelegatedExecutionScope,
  readOnlyContinuationScope,
  SCOPE_LIMITS,
  scopeExceedsCurrentAccess,
} from "../../src/scope/index.js";

/** Every call into node:fs (sync, callback and promise forms) made by code this file loads. */
const fsCalls = vi.hoisted((): string[] => []);
function watchedFs<T extends object>(real: T, prefix: string): T {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(real)) {
    out[key] =
      typeof value === "function"
        ? function (this: unknown, ...args: unknown[]) {
            fsCalls.push(`${prefix}${key}`);
            return Reflect.apply(value as (...a: unknown[]) => unknown, this, args);
          }
        : value;
  }
  return { ...out, default: out } as T;
}
vi.mock("node:fs", async (original) => watchedFs(await original<object>(), "fs."));
vi.mock("node:fs/promises", async (original) => watchedFs(await original<object>(), "fs/promises."));

const base = {
  accountId: "acct-1",
  target: { kind: "host", ref: "proj-a" },
  projectRef: "proj-a",
  workDir: "/srv/proj-a",
};

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof DelegatedScopeError) return e.code;
    throw e;
  }
  return undefined;
}

describe("captureDelegatedExecutionScope", () => {
  it("intersects the scope's tool allow-list with the current account grant (S004-193)", () => {
    const json = captureDelegatedExecutionScope(
      { ...base, tools: { allow: ["Read", "Write", "Bash"] } },
      { accountId: "acct-1", tools: { allow: ["Read", "Bash(git *)", "Edit"] } },
    );
    const scope = parseDelegatedExecutionScope(json);
    // Write is not granted; Bash narrows to the granted git subset; Edit was never requested.
    expect(scope.tools.allow).toEqual(["Bash(git *)", "Read"]);
  });

  it("unions denials of scope and authority (S004-194)", () => {
    const scope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(
        { ...base, tools: { deny: ["Bash(rm *)", "Write"] } },
        { accountId: "acct-1", tools: { deny: ["Write", "Bash(curl *)"] } },
      ),
    );
    expect(scope.tools.deny).toEqual(["Bash(curl *)", "Bash(rm *)", "Write"]);
  });

  it("returns detached canonical JSON (S004-195)", () => {
    const input = { ...base, tools: { allow: ["Write", "Read"], deny: [] as string[] }, role: "reviewer" };
    const json = captureDelegatedExecutionScope(input);
    expect(typeof json).toBe("string");
    input.tools.allow.push("Bash");
    input.role = "changed";
    const again = parseDelegatedExecutionScope(json);
    expect(again.tools.allow).toEqual(["Read", "Write"]);
    expect(again.role).toBe("reviewer");
    // Canonical: re-serializing the parsed value gives the same bytes, keys sorted, no whitespace.
    expect(canonicalJson(JSON.parse(json))).toBe(json);
    const keys = Object.keys(JSON.parse(json));
    expect(keys).toEqual([...keys].sort());
    // Two spellings of the same scope capture to the same text.
    const reordered = {
      role: "reviewer",
      tools: { deny: [], allow: ["Read", "Write", "Read"] },
      workDir: base.workDir,
      projectRef: "proj-a",
      target: base.target,
      accountId: "acct-1",
    };
    expect(captureDelegatedExecutionScope(reordered)).toBe(json);
  });

  it("missing authority, or an authority naming no restriction, adds no restriction (S004-196)", () => {
    const scope = parseDelegatedExecutionScope(captureDelegatedExecutionScope({ ...base, operator: true }));
    expect(scope.tools.allow).toBeUndefined();
    expect(scope.tools.deny).toEqual([]);
    expect(scope.operator).toBe(true);
    expect(scope.permissionBoundary).toBe("workspace-write");
    expect(scope.readOnly).toBe(false);
    // An authority that names no tools, boundary or read-only narrows none of them either.
    const wide = { ...base, tools: { allow: ["Read", "Bash"] }, permissionBoundary: "full-access" };
    const bare = parseDelegatedExecutionScope(captureDelegatedExecutionScope(wide, { accountId: "acct-1" }));
    expect(bare.tools).toEqual({ allow: ["Bash", "Read"], deny: [] });
    expect(bare.permissionBoundary).toBe("full-access");
    expect(bare.readOnly).toBe(false);
  });

  it("an explicit empty allow-list, on either side, grants no tools: none is offered to the turn (S004-197)", () => {
    const fromScope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(
        { ...base, tools: { allow: [] } },
        { accountId: "acct-1", tools: { allow: ["*"] } },
      ),
    );
    expect(fromScope.tools.allow).toEqual([]);
    const fromGrant = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ ...base }, { accountId: "acct-1", tools: { allow: [] } }),
    );
    expect(fromGrant.tools.allow).toEqual([]);
    const requestedButNotGranted = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(
        { ...base, tools: { allow: ["Read"] } },
        { accountId: "acct-1", tools: { allow: [] } },
      ),
    );
    expect(requestedButNotGranted.tools.allow).toEqual([]);
    // A turn under either scope is offered none of its tools, and a call of one is refused.
    const read: MutatingTool = {
      name: "Read",
      description: "reads",
      parameters: {},
      mutates: false,
      execute: async () => ({ content: "read" }),
    };
    for (const scope of [fromScope, fromGrant, requestedButNotGranted])
      expect(scopedTools([read], scope, false)).toEqual([]);
    expect(
      scopedTools([read], parseDelegatedExecutionScope(captureDelegatedExecutionScope(base)), false),
    ).toHaveLength(1);
  });

  it("an invalid scope throws a typed error naming the field (S004-198)", () => {
    const cases: unknown[] = [
      undefined,
      "scope",
      { ...base, accountId: "" },
      { ...base, target: { kind: "cloud" } },
      { ...base, tools: { allow: ["Bad Name!"] } },
      { ...base, unexpected: true },
      { ...base, permissionBoundary: "everything" },
      { ...base, workDir: "relative/dir" },
      { ...base, readOnly: "yes" },
      { ...base, callback: () => 1 },
    ];
    for (const raw of cases) expect(code(() => captureDelegatedExecutionScope(raw))).toMatch(/invalid_scope/);
    const thrown = (() => {
      try {
        captureDelegatedExecutionScope({ ...base, tools: { allow: ["ok", "not ok"] } });
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(thrown).toBeInstanceOf(DelegatedScopeError);
    expect((thrown as DelegatedScopeError).message).toContain("tools.allow.1");
    expect((thrown as DelegatedScopeError).retryable).toBe(false);
  });

  it("the capture is pure and validates the complete scope, nested members included (S004-192)", () => {
    const input = { ...base, tools: { allow: ["Read"], deny: ["Write"] }, sharedArtifacts: ["/a/b"] };
    const before = JSON.stringify(input);
    const first = captureDelegatedExecutionScope(input, { accountId: "acct-1", tools: { allow: ["Read"] } });
    const second = captureDelegatedExecutionScope(input, { accountId: "acct-1", tools: { allow: ["Read"] } });
    expect(first).toBe(second);
    expect(JSON.stringify(input)).toBe(before);
    // A bad value deep inside (the third artifact, the managed root) refuses the whole scope.
    expect(
      code(() => captureDelegatedExecutionScope({ ...base, sharedArtifacts: ["/a", "/b", "/c/../d"] })),
    ).toBe("invalid_scope");
    expect(
      code(() =>
        captureDelegatedExecutionScope({
          ...base,
          target: { kind: "managed", ref: "m", root: "/guest/../x" },
          projectRef: null,
        }),
      ),
    ).toBe("invalid_scope");
  });

  it("capture is bounded by each of the normalizer's limits and touches no file (S004-199)", async () => {
    const over = (n: number, make: (i: number) => string) => Array.from({ length: n }, (_, i) => make(i));
    const path = (n: number) => `/${"p".repeat(n - 1)}`;
    // Each limit: a scope at it is captured, one past it is refused as over the limit.
    const limits: [string, (atLimit: boolean) => Record<string, unknown>][] = [
      [
        "tool entries",
        (at) => ({
          ...base,
          tools: { allow: over(SCOPE_LIMITS.toolEntries + (at ? 0 : 1), (i) => `Tool${i}`) },
        }),
      ],
      [
        "shared artifacts",
        (at) => ({
          ...base,
          sharedArtifacts: over(SCOPE_LIMITS.sharedArtifacts + (at ? 0 : 1), (i) => `/a/${i}`),
        }),
      ],
      ["id length", (at) => ({ ...base, accountId: "a".repeat(SCOPE_LIMITS.idLength + (at ? 0 : 1)) })],
      ["path length", (at) => ({ ...base, workDir: path(SCOPE_LIMITS.pathLength + (at ? 0 : 1)) })],
      ["role length", (at) => ({ ...base, role: "r".repeat(SCOPE_LIMITS.roleLength + (at ? 0 : 1)) })],
      [
        "context length",
        (at) => ({ ...base, context: "c".repeat(SCOPE_LIMITS.contextLength + (at ? 0 : 1)) }),
      ],
      // every member within its own limit, the whole scope over the canonical size
      [
        "canonical size",
        (at) => ({
          ...base,
          sharedArtifacts: over(at ? 1 : SCOPE_LIMITS.sharedArtifacts, (i) => `${path(1100)}${i}`),
        }),
      ],
    ];
    for (const [what, scope] of limits) {
      expect(typeof captureDelegatedExecutionScope(scope(true)), what).toBe("string");
      expect(
        code(() => captureDelegatedExecutionScope(scope(false))),
        what,
      ).toBe("scope_limit_exceeded");
    }
    // The result is a value, not a promise, and no file was looked at (the work directory does not exist).
    // The scope modules are loaded afresh, so that they see the watched node:fs.
    vi.resetModules();
    const fresh = await import("../../src/scope/index.js");
    fsCalls.length = 0;
    const result = fresh.captureDelegatedExecutionScope(
      { ...base, workDir: "/nowhere/at/all", sharedArtifacts: ["/nowhere/else"] },
      { accountId: "acct-1", tools: { allow: ["Read"] } },
    );
    expect(typeof result).toBe("string");
    expect(fsCalls).toEqual([]);
  });

  it("the operator flag is captured only with the authority's proof (S004-200)", () => {
    const proven = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ ...base, operator: true }, { accountId: "acct-1", operator: true }),
    );
    expect(proven.operator).toBe(true);
    const unproven = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ ...base, operator: true }, { accountId: "acct-1", operator: false }),
    );
    expect(unproven.operator).toBe(false);
  });

  it("refuses a scope for another account than its authority (cross-account)", () => {
    expect(code(() => captureDelegatedExecutionScope(base, { accountId: "acct-2" }))).toBe(
      "invalid_authority",
    );
  });

  it("narrows the permission boundary and makes a read-only boundary read-only", () => {
    const scope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(
        { ...base, permissionBoundary: "full-access" },
        { accountId: "acct-1", permissionBoundary: "read-only" },
      ),
    );
    expect(scope.permissionBoundary).toBe("read-only");
    expect(scope.readOnly).toBe(true);
  });

  it("the capture composes no prompt or tool catalog: its output holds only scope fields (S004-205)", () => {
    const scope = JSON.parse(
      captureDelegatedExecutionScope(
        { ...base, role: "reviewer" },
        { accountId: "acct-1", tools: { allow: ["Read"] } },
      ),
    );
    expect(Object.keys(scope).sort()).toEqual(
      [
        "accountId",
        "operator",
        "permissionBoundary",
        "projectRef",
        "readOnly",
        "role",
        "target",
        "tools",
        "version",
        "workDir",
      ].sort(),
    );
  });
});

describe("dream marker", () => {
  const dream = { runId: "dream-1", accountUserId: "acct-1" };

  it("the host mints DelegatedExecutionScope.dream through its authority and it is stored durably (S004-565)", () => {
    const scope = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(base, { accountId: "acct-1", dream }),
    );
    expect(scope.dream).toEqual(dream);
    const repeated = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope({ ...base, dream }, { accountId: "acct-1", dream }),
    );
    expect(repeated.dream).toEqual(dream);
  });

  it("a scope naming a dream the host did not mint is refused; access descriptors cannot carry one (S004-566)", () => {
    expect(code(() => captureDelegatedExecutionScope({ ...base, dream }))).toBe("dream_not_host_minted");
    expect(code(() => captureDelegatedExecutionScope({ ...base, dream }, { accountId: "acct-1" }))).toBe(
      "dream_not_host_minted",
    );
    expect(
      code(() =>
        captureDelegatedExecutionScope(
          { ...base, dream },
          { accountId: "acct-1", dream: { ...dream, runId: "other" } },
        ),
      ),
    ).toBe("dream_not_host_minted");
    // A model-built descriptor with a smuggled dream member: the field-by-field builder drops it.
    const smuggled = { accountId: "acct-1", target: { kind: "host", ref: "proj-a" } as const, dream };
    const built = parseDelegatedExecutionScope(
      captureDelegatedExecutionScope(delegatedScopeFromAccess(smuggled), { accountId: "acct-1" }),
    );
    expect(built.dream).toBeUndefined();
  });

  it("a malformed dream value fails the whole scope closed (S004-568)", () => {
    for (const bad of [
      { runId: "", accountUserId: "acct-1" },
      { runId: "r" },
      "dream",
      { ...dream, extra: 1 },
      { runId: "r", accountUserId: "acct-2" },
    ]) {
      expect(
        code(() => captureDelegatedExecutionScope({ ...base, dream: bad }, { accountId: "acct-1", dream })),
      ).toMatch(/invalid_scope|invalid_authority/);
      expect(
        code(() =>
          parseDelegatedExecutionScope(
            JSON.stringify({ ...JSON.parse(captureDelegatedExecutionScope(base)), dream: bad }),
          ),
        ),
      ).toBe("invalid_scope");
    }
  });

  it("dream survives a continuation's narrowing, read-only included (S004-569)", () => {
    const stored = captureDelegatedExecutionScope(
      { ...base, tools: { allow: ["Read", "Bash"] } },
      { accountId: "acct-1", dream },
    );
    const cont = parseDelegatedExecutionScope(
      continuationScope(stored, { accountId: "acct-1", tools: { allow: ["Read"] } }),
    );
    expect(cont.dream).toEqual(dream);
    expect(cont.tools.allow).toEqual(["Read"]);
    const ro = parseDelegatedExecutionScope(readOnlyContinuationScope(stored, { accountId: "acct-1" }));
    expect(ro.dream).toEqual(dream);
    expect(ro.readOnly).toBe(true);
  });
});

describe("continuations", () => {
  const stored = captureDelegatedExecutionScope(
    {
      ...base,
      tools: { allow: ["Read", "Write", "Bash(git *)"], deny: ["Bash(git push*)"] },
      permissionBoundary: "full-access",
    },
    { accountId: "acct-1", operator: true },
  );

  it("readOnlyContinuationScope is minted from the caller's current access and the child's stored scope (S004-213)", () => {
    const scope = parseDelegatedExecutionScope(
      readOnlyContinuationScope(stored, {
        accountId: "acct-1",
        operator: true,
        tools: { allow: ["Read", "Bash"], deny: ["Bash(git reset*)"] },
      }),
    );
    expect(scope.readOnly).toBe(true);
    expect(scope.permissionBoundary).toBe("read-only");
    expect(scope.tools.allow).toEqual(["Bash(git *)", "Read"]);
    expect(scope.tools.deny).toEqual(["Bash(git push*)", "Bash(git reset*)"]);
    expect(scope.workDir).toBe(base.workDir);
  });

  it("ordinary continuation clamps to the caller's grant instead of refusing like verbatim mode (S004-318)", () => {
    const caller = { accountId: "acct-1", operator: true, tools: { allow: ["Read", "Bash(git status)"] } };
    expect(scopeExceedsCurrentAccess(stored, caller)?.field).toBe("tools");
    const clamped = parseDelegatedExecutionScope(continuationScope(stored, caller));
    expect(clamped.tools.allow).toEqual(["Bash(git status)", "Read"]);
  });

  it("a continuation keeps the captured working directory from the durable scope (S004-211)", () => {
    const cont = parseDelegatedExecutionScope(
      continuationScope(stored, { accountId: "acct-1", operator: true }),
    );
    expect(cont.workDir).toBe("/srv/proj-a");
    expect(cont.target).toEqual({ kind: "host", ref: "proj-a" });
  });

  it("refuses a malformed stored scope instead of granting defaults", () => {
    expect(code(() => continuationScope("{not json", { accountId: "acct-1" }))).toBe("invalid_scope");
    expect(
      code(() => readOnlyContinuationScope(JSON.stringify({ accountId: "acct-1" }), { accountId: "acct-1" })),
    ).toBe("invalid_scope");
    expect(code(() => continuationScope(stored, { accountId: "acct-2" }))).toBe("invalid_authority");
  });
});

describe("scopeExceedsCurrentAccess", () => {
  const stored = captureDelegatedExecutionScope(
    { ...base, tools: { allow: ["Read", "Bash(git *)"], deny: ["Write"] } },
    undefined,
  );

  it("an allow-list entry that merely overlaps a held tool fails the check (S004-317)", () => {
    expect(
      scopeExceedsCurrentAccess(stored, {
        accountId: "acct-1",
        tools: { allow: ["Read", "Bash(git status)"] },
      })?.field,
    ).toBe("tools");
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { allow: ["Read", "Bash(git *)"] } }),
    ).toBeUndefined();
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { allow: ["*"] } }),
    ).toBeUndefined();
  });

  it("reports denials, boundary, read-only, operator and account excess", () => {
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Bash"] } })?.field).toBe(
      "deny",
    );
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Write"] } }),
    ).toBeUndefined();
    // A denial the stored allow-list cannot reach changes nothing; one it can reach (or may) does.
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Edit"] } }),
    ).toBeUndefined();
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Bash(git push*)"] } })?.field,
    ).toBe("deny");
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", tools: { deny: ["Ed*"] } })?.field).toBe(
      "deny",
    );
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", permissionBoundary: "read-only" })?.field,
    ).toBe("permissionBoundary");
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-1", readOnly: true })?.field).toBe(
      "readOnly",
    );
    expect(scopeExceedsCurrentAccess(stored, { accountId: "acct-2" })?.field).toBe("account");
    const op = captureDelegatedExecutionScope({ ...base, operator: true });
    expect(scopeExceedsCurrentAccess(op, { accountId: "acct-1", operator: false })?.field).toBe("operator");
  });

  it("an administrator's host child may carry another host ref than its host parent (S004-269)", () => {
    const admin = captureDelegatedExecutionScope({
      accountId: "acct-1",
      operator: true,
      target: { kind: "host", ref: null },
      workDir: "/opt/other",
    });
    expect(
      scopeExceedsCurrentAccess(admin, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "host", ref: "proj-a" },
      }),
    ).toBeUndefined();
  });

  it("scoped and managed parents still require the same target (S004-270)", () => {
    expect(
      scopeExceedsCurrentAccess(stored, { accountId: "acct-1", target: { kind: "host", ref: "proj-b" } })
        ?.field,
    ).toBe("target");
    const managed = captureDelegatedExecutionScope({
      accountId: "acct-1",
      target: { kind: "managed", ref: "m1", root: "/guest" },
      workDir: "/guest/w",
    });
    expect(
      scopeExceedsCurrentAccess(managed, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "managed", ref: "m2", root: "/guest" },
      })?.field,
    ).toBe("target");
    expect(
      scopeExceedsCurrentAccess(managed, {
        accountId: "acct-1",
        target: { kind: "managed", ref: "m1", root: "/guest" },
      }),
    ).toBeUndefined();
    // An operator's freedom of host refs is between host targets only: never across kinds.
    expect(
      scopeExceedsCurrentAccess(managed, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "host", ref: null },
      })?.field,
    ).toBe("target");
    const hostChild = captureDelegatedExecutionScope({ ...base, operator: true });
    expect(
      scopeExceedsCurrentAccess(hostChild, {
        accountId: "acct-1",
        operator: true,
        target: { kind: "managed", ref: "m1", root: "/guest" },
      })?.field,
    ).toBe("target");
  });
});
