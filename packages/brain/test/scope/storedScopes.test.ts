import fc from "fast-check";
import { describe, expect, it, vi } from "vitest";
import {
  captureDelegatedExecutionScope,
  DelegatedExecutionScopeSchema,
  DelegatedScopeError,
  parseDelegatedExecutionScope,
} from "../../src/scope/index.js";
import { storedScopeMemoSize } from "../../src/scope/storedScopes.js";

/**
 * A stored scope is parsed once per text: every later read of the same text gets the same deeply frozen
 * scope, a different text never gets it, and nobody can change what the next reader sees.
 */
const stored = captureDelegatedExecutionScope({
  accountId: "acct-1",
  target: { kind: "host", ref: "proj-a" },
  projectRef: "proj-a",
  workDir: "/srv/proj-a",
  tools: { allow: ["Read", "Bash(git *)"] },
  role: "reviewer",
});

describe("parseDelegatedExecutionScope's memo of stored scopes", () => {
  it("parses a text once; later reads of it get the same frozen scope", () => {
    const parse = vi.spyOn(DelegatedExecutionScopeSchema, "safeParse");
    const text = `${stored} `;
    const first = parseDelegatedExecutionScope(text);
    const second = parseDelegatedExecutionScope(text);
    expect(second).toBe(first);
    expect(parse).toHaveBeenCalledTimes(1);
    // Its own answer is parsed already.
    expect(parseDelegatedExecutionScope(first)).toBe(first);
    expect(parse).toHaveBeenCalledTimes(1);
    parse.mockRestore();
    expect(first).toStrictEqual(DelegatedExecutionScopeSchema.parse(JSON.parse(text)));
  });

  it("a scope handed out is deeply frozen: a reader cannot change what the next one sees", () => {
    const scope = parseDelegatedExecutionScope(stored);
    expect(Object.isFrozen(scope)).toBe(true);
    expect(Object.isFrozen(scope.tools)).toBe(true);
    expect(Object.isFrozen(scope.tools.allow)).toBe(true);
    expect(Object.isFrozen(scope.target)).toBe(true);
    expect(() => {
      (scope as { role?: string }).role = "admin";
    }).toThrow(TypeError);
    expect(() => (scope.tools.allow as string[]).push("Write")).toThrow(TypeError);
    expect(parseDelegatedExecutionScope(stored).tools.allow).toEqual(["Bash(git *)", "Read"]);
  });

  it("the schema's shared defaults are not frozen by it", () => {
    // Without tools, every parse's default `deny` is one shared array: freezing it in place would freeze it
    // for every other parse of the schema.
    const text = JSON.stringify({ accountId: "acct-2", target: { kind: "host", ref: null } });
    expect(parseDelegatedExecutionScope(text).tools.deny).toEqual([]);
    const other = DelegatedExecutionScopeSchema.parse({
      accountId: "a",
      target: { kind: "host", ref: null },
    });
    expect(Object.isFrozen(other.tools.deny)).toBe(false);
  });

  it("an object that merely equals a handed-out scope is parsed, and its later changes are not seen", () => {
    const copy = structuredClone(parseDelegatedExecutionScope(stored)) as { role?: string };
    expect(parseDelegatedExecutionScope(copy as never).role).toBe("reviewer");
    copy.role = "x".repeat(200);
    expect(() => parseDelegatedExecutionScope(copy as never)).toThrow(DelegatedScopeError);
  });

  it("malformed texts throw on every read; none is kept", () => {
    const before = storedScopeMemoSize();
    for (let i = 0; i < 2; i++) {
      expect(() => parseDelegatedExecutionScope("{")).toThrow(DelegatedScopeError);
      expect(() => parseDelegatedExecutionScope('{"accountId":""}')).toThrow(DelegatedScopeError);
    }
    expect(storedScopeMemoSize()).toBe(before);
  });

  it("every text gets the parse of that text, whatever was read before (property)", () => {
    const role = fc.string({ minLength: 1, maxLength: 8 });
    const texts = fc.array(
      fc
        .record({ role, workDir: fc.constantFrom("/srv/a", "/srv/b", "/srv/a/", "srv") })
        .map(({ role, workDir }) =>
          JSON.stringify({ accountId: "acct", target: { kind: "host", ref: null }, role, workDir }),
        ),
      { minLength: 1, maxLength: 40 },
    );
    fc.assert(
      fc.property(texts, (list) => {
        for (const text of [...list, ...list]) {
          const schema = DelegatedExecutionScopeSchema.safeParse(JSON.parse(text));
          let got: unknown;
          try {
            got = parseDelegatedExecutionScope(text);
          } catch (e) {
            got = e;
          }
          if (schema.success) expect(got).toStrictEqual(schema.data);
          else expect(got).toBeInstanceOf(DelegatedScopeError);
        }
      }),
      { numRuns: 200 },
    );
  });

  it("holds a bounded number of texts", () => {
    for (let i = 0; i < 600; i++) {
      parseDelegatedExecutionScope(
        JSON.stringify({ accountId: `acct-${i}`, target: { kind: "host", ref: null } }),
      );
    }
    expect(storedScopeMemoSize()).toBeLessThanOrEqual(256);
    // The most recent texts stay.
    const spy = vi.spyOn(DelegatedExecutionScopeSchema, "safeParse");
    parseDelegatedExecutionScope(
      JSON.stringify({ accountId: "acct-599", target: { kind: "host", ref: null } }),
    );
    expect(spy).not.toHaveBeenCalled();
    spy.mockRestore();
  });
});
