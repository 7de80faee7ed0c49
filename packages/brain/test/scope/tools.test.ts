import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  captureDelegatedExecutionScope,
  entryCovers,
  globCovers,
  globMatches,
  listCovers,
  scopeExceedsCurrentAccess,
  toolCallVerdict,
} from "../../src/scope/index.js";

describe("tool patterns", () => {
  it("matches globs over names and subjects", () => {
    expect(globMatches("mcp__*", "mcp__github__search")).toBe(true);
    expect(globMatches("Read", "ReadAll")).toBe(false);
    expect(globMatches("a*b*c", "axxbyyc")).toBe(true);
    expect(globMatches("a*b*c", "axxbyy")).toBe(false);
  });

  it("listCovers needs every allow-list entry fully covered by one held entry", () => {
    expect(listCovers(["Read", "Bash(git *)"], ["Read", "Bash(git status)"])).toBe(true);
    expect(listCovers(["Read", "Bash(git *)"], ["Read", "Bash"])).toBe(false);
    expect(listCovers(["Bash(git *)", "Bash(ls *)"], ["Bash(* --help)"])).toBe(false);
    expect(listCovers(["mcp__*"], ["mcp__github__*"])).toBe(true);
    expect(listCovers(["mcp__github__*"], ["mcp__*"])).toBe(false);
    expect(listCovers(undefined, undefined)).toBe(true);
    expect(listCovers(["*"], undefined)).toBe(false);
    expect(listCovers([], [])).toBe(true);
  });

  it("the replay's access check refuses a journaled allow-list exactly when listCovers does: verbatim, never clamped (S004-316)", () => {
    const entry = fc
      .tuple(
        fc.constantFrom("Read", "Bash", "mcp__a", "mcp__*"),
        fc.constantFrom(undefined, "git *", "git status", "*", "ls"),
      )
      .map(([name, arg]) => (arg === undefined ? name : `${name}(${arg})`));
    const list = fc.array(entry, { maxLength: 3 });
    fc.assert(
      fc.property(list, fc.option(list, { nil: undefined }), (requested, held) => {
        const journaled = captureDelegatedExecutionScope({
          accountId: "acct-1",
          target: { kind: "host", ref: null },
          tools: { allow: requested },
        });
        const excess = scopeExceedsCurrentAccess(journaled, {
          accountId: "acct-1",
          tools: held === undefined ? {} : { allow: held },
        });
        expect(excess?.field === "tools").toBe(!listCovers(held, requested));
      }),
    );
    // Verbatim: a held entry that only overlaps a journaled one, either way round, does not cover it.
    const journaled = (allow: string[]) =>
      captureDelegatedExecutionScope({
        accountId: "acct-1",
        target: { kind: "host", ref: null },
        tools: { allow },
      });
    const held = { accountId: "acct-1", tools: { allow: ["Bash(git *)", "Read"] } };
    expect(scopeExceedsCurrentAccess(journaled(["Bash(git status)"]), held)).toBeUndefined();
    expect(scopeExceedsCurrentAccess(journaled(["Bash"]), held)?.field).toBe("tools");
    expect(scopeExceedsCurrentAccess(journaled(["Bash(* --help)"]), held)?.field).toBe("tools");
  });

  it("glob coverage agrees with matching on every sampled string (exact language inclusion)", () => {
    const alphabet = fc.constantFrom("a", "b", "*");
    const glob = fc.array(alphabet, { maxLength: 5 }).map((cs) => cs.join(""));
    const word = fc.array(fc.constantFrom("a", "b"), { maxLength: 6 }).map((cs) => cs.join(""));
    fc.assert(
      fc.property(glob, glob, fc.array(word, { maxLength: 30 }), (outer, inner, words) => {
        if (globCovers(outer, inner)) {
          for (const w of words) if (globMatches(inner, w)) expect(globMatches(outer, w)).toBe(true);
        }
      }),
    );
    // And a refusal always has a witness: replace each star of `inner` by a letter `outer` never names.
    fc.assert(
      fc.property(glob, glob, (outer, inner) => {
        if (!globCovers(outer, inner)) {
          const witness = inner.replaceAll("*", "z");
          expect(globMatches(inner, witness)).toBe(true);
          expect(globMatches(outer, witness)).toBe(false);
        }
      }),
    );
  });

  it("decides a call: denial wins, an argument pattern needs a subject, empty allow grants nothing", () => {
    const lists = { allow: ["read", "shell(git *)"], deny: ["shell(git push*)"] };
    expect(toolCallVerdict(lists, "read", "/x")).toEqual({ ok: true });
    expect(toolCallVerdict(lists, "shell", "git status")).toEqual({ ok: true });
    expect(toolCallVerdict(lists, "shell", "git push origin")).toEqual({
      ok: false,
      reason: "denied",
      entry: "shell(git push*)",
    });
    expect(toolCallVerdict(lists, "shell", "rm -rf /")).toEqual({ ok: false, reason: "not_allowed" });
    expect(toolCallVerdict(lists, "shell")).toEqual({
      ok: false,
      reason: "denied",
      entry: "shell(git push*)",
    });
    expect(toolCallVerdict({ allow: [], deny: [] }, "read", "/x")).toEqual({
      ok: false,
      reason: "not_allowed",
    });
    expect(toolCallVerdict({ deny: [] }, "anything")).toEqual({ ok: true });
    expect(entryCovers("shell", "shell(git *)")).toBe(true);
    expect(entryCovers("shell(git *)", "shell")).toBe(false);
  });
});
