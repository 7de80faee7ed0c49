import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  captureDelegatedExecutionScope,
  continuationScope,
  type DelegatedExecutionScope,
  entryCovers,
  listCovers,
  PERMISSION_BOUNDARIES,
  parseDelegatedExecutionScope,
  readOnlyContinuationScope,
  scopeExceedsCurrentAccess,
  toolCallVerdict,
} from "../../src/scope/index.js";

const names = fc.constantFrom("read", "write", "edit", "shell", "mcp__gh__search", "mcp__gh__push");
const nameGlob = fc.oneof(names, fc.constantFrom("*", "mcp__*", "mcp__gh__*", "re*", "*e*"));
const argGlob = fc.constantFrom("git *", "git status", "git push*", "*", "/src/*", "ls", "* --help");
const entry = fc.oneof(
  nameGlob,
  fc.tuple(nameGlob, argGlob).map(([n, a]) => `${n}(${a})`),
);
const list = fc.option(fc.uniqueArray(entry, { maxLength: 5 }), { nil: undefined });
const boundary = fc.option(fc.constantFrom(...PERMISSION_BOUNDARIES), { nil: undefined });
const calls = fc.array(
  fc.tuple(
    names,
    fc.option(fc.constantFrom("git status", "git push x", "ls", "/src/a", "rm -rf /", "x --help"), {
      nil: undefined,
    }),
  ),
  {
    maxLength: 12,
  },
);

const scopeArb = fc.record({
  allow: list,
  deny: fc.uniqueArray(entry, { maxLength: 4 }),
  boundary: fc.constantFrom(...PERMISSION_BOUNDARIES),
  readOnly: fc.boolean(),
  operator: fc.boolean(),
});
const authorityArb = fc.record({
  allow: list,
  deny: fc.option(fc.uniqueArray(entry, { maxLength: 4 }), { nil: undefined }),
  boundary,
  readOnly: fc.option(fc.boolean(), { nil: undefined }),
  operator: fc.boolean(),
});

function rawScope(s: typeof scopeArb extends fc.Arbitrary<infer T> ? T : never) {
  return {
    accountId: "acct",
    target: { kind: "host", ref: "p" },
    workDir: "/w",
    tools: { ...(s.allow ? { allow: s.allow } : {}), deny: s.deny },
    permissionBoundary: s.boundary,
    readOnly: s.readOnly,
    operator: s.operator,
  };
}

function rawAuthority(a: typeof authorityArb extends fc.Arbitrary<infer T> ? T : never) {
  return {
    accountId: "acct",
    operator: a.operator,
    tools: { ...(a.allow ? { allow: a.allow } : {}), ...(a.deny ? { deny: a.deny } : {}) },
    ...(a.boundary ? { permissionBoundary: a.boundary } : {}),
    ...(a.readOnly !== undefined ? { readOnly: a.readOnly } : {}),
  };
}

const rank = (b: string) => PERMISSION_BOUNDARIES.indexOf(b as (typeof PERMISSION_BOUNDARIES)[number]);

/** `narrow` permits no call, boundary, write or operator power that `wide` does not. */
function assertNoWider(
  narrow: DelegatedExecutionScope,
  wide: DelegatedExecutionScope,
  sample: [string, string | undefined][],
) {
  expect(listCovers(wide.tools.allow, narrow.tools.allow)).toBe(true);
  for (const d of wide.tools.deny) expect(narrow.tools.deny.some((n) => entryCovers(n, d))).toBe(true);
  expect(rank(narrow.permissionBoundary)).toBeLessThanOrEqual(rank(wide.permissionBoundary));
  if (wide.readOnly) expect(narrow.readOnly).toBe(true);
  if (!wide.operator) expect(narrow.operator).toBe(false);
  for (const [name, subject] of sample) {
    if (toolCallVerdict(narrow.tools, name, subject).ok)
      expect(toolCallVerdict(wide.tools, name, subject).ok).toBe(true);
  }
}

describe("capture and continuation never widen a scope (property)", () => {
  it("live account grants intersect the captured scope and never widen it (S004-210)", () => {
    fc.assert(
      fc.property(scopeArb, authorityArb, calls, (s, a, sample) => {
        const requested = parseDelegatedExecutionScope(captureDelegatedExecutionScope(rawScope(s)));
        const captured = parseDelegatedExecutionScope(
          captureDelegatedExecutionScope(rawScope(s), rawAuthority(a)),
        );
        assertNoWider(captured, requested, sample);
        // Nor wider than the authority itself.
        const authorityAsScope = parseDelegatedExecutionScope(
          captureDelegatedExecutionScope({
            ...rawScope({
              allow: a.allow,
              deny: a.deny ?? [],
              boundary: a.boundary ?? "full-access",
              readOnly: a.readOnly ?? false,
              operator: a.operator,
            }),
          }),
        );
        assertNoWider(captured, authorityAsScope, sample);
        // A capture that held nothing back passes the verbatim check against the same access.
        expect(
          scopeExceedsCurrentAccess(
            captureDelegatedExecutionScope(rawScope(s), rawAuthority(a)),
            rawAuthority(a),
          )?.field,
        ).not.toBe("deny");
      }),
      { numRuns: 300 },
    );
  });

  it("a scope that passes the verbatim check permits no call the current access forbids", () => {
    fc.assert(
      fc.property(scopeArb, authorityArb, calls, (s, a, sample) => {
        const stored = captureDelegatedExecutionScope(rawScope(s));
        if (scopeExceedsCurrentAccess(stored, rawAuthority(a)) !== undefined) return;
        const scope = parseDelegatedExecutionScope(stored);
        const access = { ...(a.allow ? { allow: a.allow } : {}), deny: a.deny ?? [] };
        for (const [name, subject] of sample) {
          if (toolCallVerdict(scope.tools, name, subject).ok)
            expect(toolCallVerdict(access, name, subject).ok).toBe(true);
        }
      }),
      { numRuns: 500 },
    );
  });

  it("continuation and read-only continuation never widen the stored scope, and read-only is read-only", () => {
    fc.assert(
      fc.property(scopeArb, authorityArb, authorityArb, calls, (s, a1, a2, sample) => {
        const stored = captureDelegatedExecutionScope(rawScope(s), rawAuthority(a1));
        const storedScope = parseDelegatedExecutionScope(stored);
        const cont = parseDelegatedExecutionScope(continuationScope(stored, rawAuthority(a2)));
        assertNoWider(cont, storedScope, sample);
        const ro = parseDelegatedExecutionScope(readOnlyContinuationScope(stored, rawAuthority(a2)));
        assertNoWider(ro, cont, sample);
        expect(ro.readOnly).toBe(true);
        expect(ro.permissionBoundary).toBe("read-only");
        // Continuing again never gets anything back.
        const twice = parseDelegatedExecutionScope(
          continuationScope(continuationScope(stored, rawAuthority(a2)), rawAuthority(a1)),
        );
        assertNoWider(twice, cont, sample);
      }),
      { numRuns: 300 },
    );
  });
});
