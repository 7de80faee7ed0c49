import { mkdirSync, writeFileSync } from "node:fs";
import { isAbsolute, join, relative } from "node:path";
import { timeWithin, timeWithinAsync } from "@crw/tools/timing";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ZodError } from "zod";
import {
  CHILD_TOOL_NAMES,
  type ChildToolOptions,
  checkChildToolCall,
  createChildTools,
  ToolCallRefusedError,
} from "../../src/agent/index.js";
import {
  captureDelegatedExecutionScope,
  continuationScope,
  type DelegatedExecutionScope,
  DelegatedScopeError,
  entryCovers,
  globMatches,
  PERMISSION_BOUNDARIES,
  parseDelegatedExecutionScope,
  parseToolEntry,
  readOnlyContinuationScope,
  SCOPE_LIMITS,
  toolCallVerdict,
} from "../../src/scope/index.js";
import { scratchDir } from "../delegation/helpers.js";

/**
 * Fuzzing the delegation scope (its schema through capture and read-back), the tool entry grammar, and
 * the argument checks of the child's coding tools. Every case is a typed rejection (`DelegatedScopeError`,
 * `ToolCallRefusedError`, a zod refusal of the arguments) or an accepted value that satisfies the
 * module's own invariants, in bounded time; a captured or continued scope never grants more than what it
 * was captured from.
 */
const RUNS = Number(process.env.CRW_FUZZ_RUNS ?? 10_000);
const CASE_BUDGET_MS = 200;

const SCOPE_CODES = new Set([
  "invalid_scope",
  "scope_limit_exceeded",
  "dream_not_host_minted",
  "dream_account_mismatch",
  "invalid_authority",
  "invalid_work_dir",
  "work_dir_outside_project",
  "work_dir_unavailable",
  "work_dir_not_permitted",
]);
const REFUSAL_CODES = new Set([
  "tool_not_allowed",
  "tool_denied",
  "read_only",
  "outside_work_dir",
  "git_metadata",
  "work_dir_moved",
  "unknown_tool",
]);

function within<T>(fn: () => T): { value?: T; error?: unknown } {
  const { outcome, ms } = timeWithin(fn, CASE_BUDGET_MS);
  expect(ms, "case time (ms)").toBeLessThan(CASE_BUDGET_MS);
  return "ok" in outcome ? { value: outcome.ok } : { error: outcome.error };
}

function expectScopeRefusal(error: unknown): void {
  if (!(error instanceof DelegatedScopeError))
    throw new Error(`untyped throw: ${(error as Error)?.name}: ${(error as Error)?.message}`);
  expect(SCOPE_CODES.has(error.code), error.code).toBe(true);
}

const controlChar = fc.integer({ min: 0, max: 0x1f }).map((c) => String.fromCharCode(c));
const hostileString = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 10 }) },
  fc.string({ unit: "binary", maxLength: 10 }),
  fc.constantFrom("", "\u0000", "a\u0000b", "\uD800", "__proto__", "constructor", "x".repeat(257)),
  fc.array(controlChar, { minLength: 1, maxLength: 3 }).map((cs) => `a${cs.join("")}`),
);
const wrongValue = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fc.constantFrom(null, true, -1, 0, 1.5, 1e308, [], {}, { toString: 1 }, { valueOf: 1 }),
);

// ---- tool entries ----------------------------------------------------------------------------------------

const entryChars = fc.constantFrom(
  "a",
  "b",
  "*",
  "(",
  ")",
  " ",
  "_",
  ":",
  ".",
  "-",
  "\n",
  "\r",
  "\0",
  "é",
  "\t",
);
const entryArb = fc.oneof(
  fc.array(entryChars, { maxLength: 16 }).map((cs) => cs.join("")),
  fc.string({ unit: "binary", maxLength: 20 }),
  fc
    .tuple(
      fc.stringMatching(/^[A-Za-z0-9_.:*-]{0,130}$/),
      fc.option(fc.string({ maxLength: 520 }), { nil: undefined }),
    )
    .map(([name, arg]) => (arg === undefined ? name : `${name}(${arg})`)),
  fc.constantFrom(
    `a(${"x".repeat(512)})`,
    `a(${"x".repeat(513)})`,
    "x".repeat(128),
    "x".repeat(129),
    "a()",
    "a(()",
  ),
);

// ---- scopes ----------------------------------------------------------------------------------------------

const validEntry = fc.oneof(
  fc.constantFrom("read", "write", "edit", "shell", "mcp__gh__search", "mcp__gh__push", "*", "mcp__*", "re*"),
  fc
    .tuple(
      fc.constantFrom("read", "shell", "write", "*", "mcp__*"),
      fc.constantFrom("git *", "git status", "*", "/src/*", "ls", "* --help", "a*b*", ""),
    )
    .map(([n, a]) => `${n}(${a})`),
);
const targetArb = fc.oneof(
  fc.record({ kind: fc.constant("host"), ref: fc.option(fc.constantFrom("p", "q"), { nil: null }) }),
  fc.record({
    kind: fc.constant("managed"),
    ref: fc.constant("m"),
    root: fc.constantFrom("/srv/m", "/srv/m/", "/a/../b", "rel"),
  }),
  fc.record({ kind: fc.constant("local"), targetId: fc.constantFrom("t1", "") }),
  wrongValue,
);
const workDirArb = fc.oneof(
  fc.constantFrom("/w", "/w/sub", "/", null),
  fc.constantFrom("/w/", "/w/../x", "//server/share", "C:\\x", "C:x", "\\x", "rel", "/w\u0000", "/w\n", ""),
  hostileString,
);
const artifactArb = fc.oneof(
  fc.constantFrom("/w/a.txt", "C:/a/b", "//srv/share/f"),
  fc.constantFrom("/w/./a", "/w//a", "/w/a/", "a", "C:\\a", "/w/\u0001"),
  hostileString,
);

/** A valid raw scope: defaults may fill what it leaves out. */
const validScopeArb = fc.record(
  {
    accountId: fc.constant("acct"),
    operator: fc.boolean(),
    target: fc.constant({ kind: "host", ref: "p" }),
    projectRef: fc.constantFrom("p", null),
    workDir: fc.constantFrom("/w", "/w/sub", "/", null),
    tools: fc.record(
      { allow: fc.array(validEntry, { maxLength: 4 }), deny: fc.array(validEntry, { maxLength: 4 }) },
      { requiredKeys: [] },
    ),
    permissionBoundary: fc.constantFrom(...PERMISSION_BOUNDARIES),
    readOnly: fc.boolean(),
    role: fc.constantFrom("reviewer", "r"),
    context: fc.string({ maxLength: 20 }),
    sharedArtifacts: fc.subarray(["/w/a.txt", "C:/a/b", "//srv/share/f"]),
    fork: fc.boolean(),
  },
  { requiredKeys: ["accountId", "target"] },
);
/** A valid scope with one member made wrong (or one extra member). */
const nearScopeArb = fc
  .tuple(
    validScopeArb,
    fc.constantFrom(
      "version",
      "accountId",
      "operator",
      "target",
      "projectRef",
      "workDir",
      "tools",
      "permissionBoundary",
      "readOnly",
      "role",
      "context",
      "sharedArtifacts",
      "fork",
      "dream",
      "__proto__",
      "extra",
    ),
    fc.oneof(hostileString, wrongValue, targetArb, workDirArb, fc.array(entryArb, { maxLength: 2 })),
  )
  .map(([scope, key, value]) => {
    const out: Record<string, unknown> = { ...scope };
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
    return out;
  });
/** A raw scope: any member possibly of the wrong kind. */
const hostileScopeArb = fc
  .record(
    {
      version: fc.oneof(fc.constant(1), fc.constantFrom(2, "1")),
      accountId: fc.oneof({ weight: 6, arbitrary: fc.constant("acct") }, hostileString),
      operator: fc.oneof({ weight: 6, arbitrary: fc.boolean() }, wrongValue),
      target: fc.oneof({ weight: 6, arbitrary: fc.constant({ kind: "host", ref: "p" }) }, targetArb),
      projectRef: fc.constantFrom("p", null, "other"),
      workDir: workDirArb,
      tools: fc.oneof(
        {
          weight: 6,
          arbitrary: fc.record(
            {
              allow: fc.array(fc.oneof({ weight: 6, arbitrary: validEntry }, entryArb), { maxLength: 4 }),
              deny: fc.array(fc.oneof({ weight: 6, arbitrary: validEntry }, entryArb), { maxLength: 4 }),
            },
            { requiredKeys: [] },
          ),
        },
        fc.constant({ deny: Array.from({ length: SCOPE_LIMITS.toolEntries + 1 }, () => "read") }),
        wrongValue,
      ),
      permissionBoundary: fc.oneof(fc.constantFrom(...PERMISSION_BOUNDARIES), hostileString),
      readOnly: fc.oneof({ weight: 6, arbitrary: fc.boolean() }, wrongValue),
      role: fc.oneof(fc.constantFrom("reviewer"), hostileString),
      context: fc.oneof(hostileString, fc.constant("c".repeat(SCOPE_LIMITS.contextLength + 1))),
      sharedArtifacts: fc.oneof(fc.array(artifactArb, { maxLength: 3 }), wrongValue),
      fork: fc.oneof(fc.boolean(), wrongValue),
      dream: fc.oneof(
        fc.constant({ runId: "r", accountUserId: "acct" }),
        fc.constant({ runId: "r", accountUserId: "other" }),
        wrongValue,
      ),
      extra: wrongValue,
    },
    { requiredKeys: ["accountId", "target"] },
  )
  .chain((s) =>
    fc.option(wrongValue, { nil: undefined }).map((proto) => {
      // `__proto__` as an own member (what JSON text gives), never as the prototype.
      const out: Record<string, unknown> = { ...s };
      if (proto !== undefined)
        Object.defineProperty(out, "__proto__", { value: proto, enumerable: true, writable: true });
      return out;
    }),
  );
const rawScopeArb = fc.oneof(validScopeArb, nearScopeArb, hostileScopeArb);
const authorityArb = fc.oneof(
  fc.record(
    {
      accountId: fc.oneof({ weight: 6, arbitrary: fc.constant("acct") }, hostileString),
      operator: fc.boolean(),
      tools: fc.record(
        {
          allow: fc.array(fc.oneof({ weight: 6, arbitrary: validEntry }, entryArb), { maxLength: 4 }),
          deny: fc.array(fc.oneof({ weight: 6, arbitrary: validEntry }, entryArb), { maxLength: 4 }),
        },
        { requiredKeys: [] },
      ),
      permissionBoundary: fc.constantFrom(...PERMISSION_BOUNDARIES),
      readOnly: fc.boolean(),
      target: fc.oneof(fc.constant({ kind: "host", ref: "p" }), targetArb),
      dream: fc.oneof(fc.constant({ runId: "r", accountUserId: "acct" }), wrongValue),
    },
    { requiredKeys: ["accountId"] },
  ),
  wrongValue,
);

const rank = (b: string) => PERMISSION_BOUNDARIES.indexOf(b as (typeof PERMISSION_BOUNDARIES)[number]);

// ---- tool calls ------------------------------------------------------------------------------------------

const toolNameArb = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom(...CHILD_TOOL_NAMES) },
  fc.constantFrom("Read", "bash", "", "__proto__", "constructor", "read\u0000", "mcp__x"),
);
const pathArb = fc.oneof(
  fc.constantFrom(
    "a.txt",
    "src/x.ts",
    ".",
    "./",
    "..",
    "../x",
    "/etc/passwd",
    "/",
    ".git/config",
    "a/.git/hooks/x",
  ),
  fc.constantFrom("a\u0000b", "a\nb", "x".repeat(5000), "~", "$HOME", "a/../../b", "//x", "\\..\\x"),
  hostileString,
);
/** Any arguments: members of every tool at once, or arbitrary keys. */
const looseArgsArb = fc.oneof(
  fc.record(
    {
      path: fc.oneof({ weight: 6, arbitrary: pathArb }, wrongValue),
      content: fc.oneof(hostileString, wrongValue),
      command: fc.oneof(fc.constantFrom("ls", "git status", "rm -rf /"), hostileString, wrongValue),
      pattern: fc.oneof(fc.constantFrom("*.ts", "^(a+)+$", "["), hostileString, wrongValue),
      extra: wrongValue,
    },
    { requiredKeys: [] },
  ),
  fc.dictionary(fc.string({ maxLength: 8 }), wrongValue, { maxKeys: 3 }),
);
const nearly = <T>(valid: fc.Arbitrary<T>) => fc.oneof({ weight: 5, arbitrary: valid }, wrongValue);
const textArb = fc.oneof(fc.constantFrom("one", "two\n", "x"), hostileString);
const countArb = fc.oneof(
  fc.integer({ min: 1, max: 5 }),
  fc.constantFrom(0, -1, 1.5, 2 ** 53, 1e308, Number.NaN),
);
/** Each tool's own argument shape with values near the valid ones, sometimes one extra member. */
const SHAPES: Record<string, fc.Arbitrary<Record<string, unknown>>> = {
  read: fc.record(
    { path: nearly(pathArb), offset: nearly(countArb), limit: nearly(countArb) },
    { requiredKeys: ["path"] },
  ),
  write: fc.record({ path: nearly(pathArb), content: nearly(textArb) }),
  edit: fc.record({ path: nearly(pathArb), oldText: nearly(textArb), newText: nearly(textArb) }),
  shell: fc.record(
    {
      command: nearly(fc.oneof(fc.constantFrom("ls", "git status", "rm -rf /", "a\u0000b"), hostileString)),
      timeoutSeconds: nearly(fc.oneof(fc.double(), fc.constantFrom(0, -1, 3600, 3601, 1e308))),
    },
    { requiredKeys: ["command"] },
  ),
  ls: fc.record({ path: nearly(pathArb) }, { requiredKeys: [] }),
  find: fc.record({ pattern: nearly(textArb), path: nearly(pathArb) }, { requiredKeys: ["pattern"] }),
  grep: fc.record(
    {
      pattern: nearly(fc.oneof(fc.constantFrom("^(a+)+$", "[", "a\u0000"), textArb)),
      path: nearly(pathArb),
      literal: nearly(fc.boolean()),
      ignoreCase: nearly(fc.boolean()),
      glob: nearly(fc.oneof(fc.constantFrom("*.ts", "a\u0000"), textArb)),
    },
    { requiredKeys: ["pattern"] },
  ),
};
/** Arguments for tool `name`: mostly its own shape (possibly with one extra member), else anything. */
const argsFor = (name: string): fc.Arbitrary<Record<string, unknown>> =>
  fc.oneof(
    {
      weight: 4,
      arbitrary: fc
        .tuple(
          Object.hasOwn(SHAPES, name)
            ? (SHAPES[name] as fc.Arbitrary<Record<string, unknown>>)
            : looseArgsArb,
          // one extra member in one case of eight
          fc.oneof(
            { weight: 7, arbitrary: fc.constant(null) },
            fc.tuple(fc.constantFrom("extra", "__proto__", "Path"), wrongValue),
          ),
        )
        .map(([args, extra]) => {
          const out = { ...args };
          if (extra)
            Object.defineProperty(out, extra[0], { value: extra[1], enumerable: true, writable: true });
          return out;
        }),
    },
    looseArgsArb,
  );
const toolCallArb = toolNameArb.chain((name) => argsFor(name).map((args) => ({ name, args })));

function scopeFor(tools: { allow?: string[]; deny: string[] }, readOnly = false): DelegatedExecutionScope {
  return parseDelegatedExecutionScope(
    captureDelegatedExecutionScope({
      accountId: "acct",
      target: { kind: "host", ref: "p" },
      workDir: "/w",
      tools,
      readOnly,
    }),
  );
}

const workDir = scratchDir("crw-fuzz-scope-");
mkdirSync(join(workDir, "src"));
writeFileSync(join(workDir, "a.txt"), "one\ntwo\nthree\n");
writeFileSync(join(workDir, "src", "x.ts"), "export {};\n");

describe("fuzzing tool entries, scopes and tool arguments", () => {
  it(`a tool entry parses to its name and argument glob, or is refused (${RUNS} cases)`, () => {
    fc.assert(
      fc.property(entryArb, (entry) => {
        const { value, error } = within(() => parseToolEntry(entry));
        expect(error).toBeUndefined();
        if (value === undefined) return;
        expect(value.name).toMatch(/^[A-Za-z0-9_.:*-]{1,128}$/);
        if (value.arg !== undefined) {
          expect(value.arg.length).toBeLessThanOrEqual(512);
          expect(value.arg).not.toMatch(/[\n\r\0]/);
        }
        // The entry is exactly its parts: nothing dropped or added.
        expect(value.arg === undefined ? value.name : `${value.name}(${value.arg})`).toBe(entry);
      }),
      { numRuns: RUNS },
    );
  });

  it(`entry coverage is sound and matching stays fast on long subjects (${RUNS} cases)`, () => {
    const word = fc
      .array(fc.constantFrom("a", "b", "*", " ", "("), { maxLength: 8 })
      .map((cs) => cs.join(""));
    const glob = fc.array(fc.constantFrom("a", "b", "*"), { maxLength: 6 }).map((cs) => cs.join(""));
    const entry = fc
      .tuple(glob, fc.option(glob, { nil: undefined }))
      .map(([n, a]) => (a === undefined ? n || "a" : `${n || "a"}(${a})`));
    fc.assert(
      fc.property(
        entry,
        entry,
        fc.array(fc.tuple(word, fc.option(word, { nil: undefined })), { maxLength: 10 }),
        (outer, inner, calls) => {
          const { value: covers } = within(() => entryCovers(outer, inner));
          if (!covers) return;
          for (const [name, subject] of calls) {
            const lists = (allow: string) => ({ allow: [allow], deny: [] });
            if (toolCallVerdict(lists(inner), name, subject).ok)
              expect(toolCallVerdict(lists(outer), name, subject).ok).toBe(true);
            // and a denial by the covered entry is a denial by the covering one
            if (!toolCallVerdict({ deny: [inner] }, name, subject).ok)
              expect(toolCallVerdict({ deny: [outer] }, name, subject).ok).toBe(false);
          }
        },
      ),
      { numRuns: RUNS },
    );
    // The worst case of the star matcher: a 512-character pattern of stars against a 100 KB subject.
    const pattern = `${"*a".repeat(255)}*b`;
    const { outcome, ms } = timeWithin(() => globMatches(pattern, "a".repeat(100_000)), 2_000);
    expect(outcome).toEqual({ ok: false });
    expect(ms).toBeLessThan(2_000);
  });

  it(`a raw scope is captured and read back, or refused with a typed DelegatedScopeError (${RUNS} cases)`, () => {
    let captured = 0;
    fc.assert(
      fc.property(rawScopeArb, fc.option(authorityArb, { nil: undefined }), (raw, authority) => {
        const { value: stored, error } = within(() =>
          captureDelegatedExecutionScope(
            raw,
            authority as Parameters<typeof captureDelegatedExecutionScope>[1],
          ),
        );
        if (error !== undefined) return expectScopeRefusal(error);
        expect(typeof stored).toBe("string");
        const scope = parseDelegatedExecutionScope(stored as string);
        // Canonical: reading back and capturing again gives the same text.
        // (a dream is accepted again only from an authority that mints the same one)
        const again = scope.dream
          ? { accountId: scope.accountId, operator: scope.operator, dream: scope.dream }
          : undefined;
        expect(captureDelegatedExecutionScope(scope, again)).toBe(stored);
        expect(Buffer.byteLength(stored as string)).toBeLessThanOrEqual(SCOPE_LIMITS.canonicalBytes);
        // stored as a text column: a raw U+0000 there would be a PostgreSQL error (JSON escapes it)
        expect(stored).not.toContain("\u0000");
        expect(Object.getPrototypeOf(scope)).toBe(Object.prototype);
        if (scope.dream) expect(scope.dream.accountUserId).toBe(scope.accountId);
        captured++;
      }),
      { numRuns: RUNS },
    );
    expect(captured).toBeGreaterThan(RUNS / 100);
  });

  it(`stored scope text is read back or refused, never a default (${RUNS} cases)`, () => {
    const text = fc.oneof(
      fc.string({ unit: "binary", maxLength: 40 }),
      fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v) ?? "null"),
      rawScopeArb.map((s) => JSON.stringify(s)),
      fc.integer({ min: 1, max: 5_000 }).map((d) => `${"[".repeat(d)}${"]".repeat(d)}`),
    );
    fc.assert(
      fc.property(text, (stored) => {
        const { value, error } = within(() => parseDelegatedExecutionScope(stored));
        if (error !== undefined) return expectScopeRefusal(error);
        expect(value?.accountId.length).toBeGreaterThan(0);
      }),
      { numRuns: RUNS },
    );
  });

  it(`capture and continuation never widen the scope with arbitrary entries (${RUNS} cases)`, () => {
    const glob = fc
      .array(fc.constantFrom("a", "b", "*"), { minLength: 1, maxLength: 4 })
      .map((cs) => cs.join(""));
    const entry = fc
      .tuple(glob, fc.option(glob, { nil: undefined }))
      .map(([n, a]) => (a === undefined ? n : `${n}(${a})`));
    const lists = fc.record({
      allow: fc.option(fc.array(entry, { maxLength: 4 }), { nil: undefined }),
      deny: fc.array(entry, { maxLength: 3 }),
    });
    const word = fc.array(fc.constantFrom("a", "b"), { minLength: 1, maxLength: 5 }).map((cs) => cs.join(""));
    const calls = fc.array(fc.tuple(word, fc.option(word, { nil: undefined })), {
      minLength: 1,
      maxLength: 12,
    });
    const side = fc.record({
      tools: lists,
      boundary: fc.constantFrom(...PERMISSION_BOUNDARIES),
      readOnly: fc.boolean(),
      operator: fc.boolean(),
    });
    type Side = typeof side extends fc.Arbitrary<infer T> ? T : never;
    const tools = (s: Side) => ({ ...(s.tools.allow ? { allow: s.tools.allow } : {}), deny: s.tools.deny });
    const raw = (s: Side) => ({
      accountId: "acct",
      target: { kind: "host", ref: "p" },
      tools: tools(s),
      permissionBoundary: s.boundary,
      readOnly: s.readOnly,
      operator: s.operator,
    });
    const authority = (s: Side) => ({
      accountId: "acct",
      operator: s.operator,
      tools: tools(s),
      permissionBoundary: s.boundary,
      readOnly: s.readOnly,
    });
    const noWider = (
      narrow: DelegatedExecutionScope,
      wide: Side | DelegatedExecutionScope,
      sample: [string, string | undefined][],
    ) => {
      const w =
        "tools" in wide && "boundary" in wide
          ? {
              tools: tools(wide),
              permissionBoundary: wide.boundary,
              readOnly: wide.readOnly,
              operator: wide.operator,
            }
          : (wide as DelegatedExecutionScope);
      for (const [name, subject] of sample)
        if (toolCallVerdict(narrow.tools, name, subject).ok)
          expect(toolCallVerdict(w.tools, name, subject).ok).toBe(true);
      expect(rank(narrow.permissionBoundary)).toBeLessThanOrEqual(rank(w.permissionBoundary));
      if (w.readOnly) expect(narrow.readOnly).toBe(true);
      if (!w.operator) expect(narrow.operator).toBe(false);
    };
    fc.assert(
      fc.property(side, side, side, calls, (s, a1, a2, sample) => {
        const stored = captureDelegatedExecutionScope(raw(s), authority(a1));
        const captured = parseDelegatedExecutionScope(stored);
        noWider(captured, s, sample);
        noWider(captured, a1, sample);
        const cont = parseDelegatedExecutionScope(continuationScope(stored, authority(a2)));
        noWider(cont, captured, sample);
        noWider(cont, a2, sample);
        const ro = parseDelegatedExecutionScope(readOnlyContinuationScope(stored, authority(a2)));
        noWider(ro, cont, sample);
        expect(ro.readOnly).toBe(true);
      }),
      { numRuns: RUNS },
    );
  });

  it(`a child tool call is checked to a typed refusal or a call inside the working directory (${RUNS} cases)`, () => {
    let allowed = 0;
    const scopeArb = fc.record({
      allow: fc.option(fc.array(validEntry, { maxLength: 3 }), { nil: undefined }),
      deny: fc.array(validEntry, { maxLength: 2 }),
      readOnly: fc.boolean(),
    });
    fc.assert(
      fc.property(scopeArb, fc.boolean(), toolCallArb, (s, turnReadOnly, { name, args }) => {
        const options: ChildToolOptions = {
          workDir,
          scope: scopeFor({ ...(s.allow ? { allow: s.allow } : {}), deny: s.deny }, s.readOnly),
          readOnly: turnReadOnly,
        };
        const { value: call, error } = within(() =>
          checkChildToolCall(options, name, args as Record<string, unknown>),
        );
        if (error !== undefined) {
          if (!(error instanceof ToolCallRefusedError))
            throw new Error(`untyped throw: ${(error as Error)?.name}: ${(error as Error)?.message}`);
          expect(REFUSAL_CODES.has(error.code), error.code).toBe(true);
          return;
        }
        if (!call) throw new Error("no call and no refusal");
        expect(call.name).toBe(name);
        if (call.absolutePath !== undefined) {
          const rel = relative(workDir, call.absolutePath);
          expect(rel.startsWith("..") || isAbsolute(rel), call.absolutePath).toBe(false);
          if (name === "write" || name === "edit") {
            expect(options.scope.readOnly || turnReadOnly).toBe(false);
            expect(call.subject.split("/")).not.toContain(".git");
          }
        }
        expect(toolCallVerdict(options.scope.tools, name, call.subject).ok).toBe(true);
        allowed++;
      }),
      { numRuns: RUNS },
    );
    expect(allowed).toBeGreaterThan(RUNS / 100);
  });

  it(`every child tool refuses bad arguments, and denied calls, before any effect (${RUNS} cases)`, async () => {
    // Every call is denied by an argument pattern, so no tool is hidden from the catalog and none may act.
    const denyAll = createChildTools({
      workDir,
      scope: scopeFor({ deny: CHILD_TOOL_NAMES.map((n) => `${n}(*)`) }),
    });
    // Reads are allowed: they touch nothing, and must fail typed on any path.
    const reader = createChildTools({ workDir, scope: scopeFor({ allow: ["read"], deny: [] }) });
    const read = reader.find((t) => t.name === "read");
    expect(denyAll.map((t) => t.name).sort()).toEqual([...CHILD_TOOL_NAMES].sort());
    const seen = new Map<string, string>();
    let reads = 0;
    await fc.assert(
      fc.asyncProperty(
        fc
          .nat({ max: denyAll.length })
          .chain((i) => argsFor(denyAll[i]?.name ?? "read").map((args) => ({ i, args }))),
        async ({ i, args }) => {
          const tool = i === denyAll.length ? read : denyAll[i];
          if (!tool) throw new Error("no tool");
          // Refused calls and reads have no effect a second run would see.
          const timed = await timeWithinAsync(
            () => tool.execute("call-1", args as never, AbortSignal.timeout(5_000)),
            CASE_BUDGET_MS,
          );
          const failed = "error" in timed.outcome;
          const outcome: unknown = "ok" in timed.outcome ? timed.outcome.ok : timed.outcome.error;
          expect(timed.ms).toBeLessThan(CASE_BUDGET_MS);
          if (tool !== read) {
            expect(failed, `${tool.name} ran with ${JSON.stringify(args)}`).toBe(true);
            const typed = outcome instanceof ZodError || outcome instanceof ToolCallRefusedError;
            if (!typed) seen.set(`${tool.name}: ${(outcome as Error)?.name}`, JSON.stringify(args));
            expect(typed, `${tool.name}: ${(outcome as Error)?.name}: ${(outcome as Error)?.message}`).toBe(
              true,
            );
          } else if (failed) {
            const e = outcome as Error & { code?: unknown };
            const typed =
              e instanceof ZodError ||
              e instanceof ToolCallRefusedError ||
              // a file that is not there or not a file: the file system's own typed error
              (typeof e.code === "string" && /^E[A-Z]+$/.test(e.code) && !(e instanceof TypeError));
            if (!typed) seen.set(`read: ${e?.name} ${String(e?.code)}`, JSON.stringify(args));
          } else reads++;
        },
      ),
      { numRuns: RUNS },
    );
    expect(Object.fromEntries(seen)).toEqual({});
    // some reads reach a file and succeed (the property is not only about refusals)
    expect(reads).toBeGreaterThan(0);
  }, 120_000);
});

describe("regressions the scope and tool-argument fuzz found", () => {
  it("a read whose path holds U+0000 is refused as bad arguments (it threw Node's TypeError ERR_INVALID_ARG_VALUE from stat)", async () => {
    const [read] = createChildTools({ workDir, scope: scopeFor({ allow: ["read"], deny: [] }) });
    const refused = await read
      ?.execute("call-1", { path: "a\u0000b", offset: 4, limit: 2 } as never)
      .catch((e) => e);
    expect(refused).toBeInstanceOf(ZodError);
    expect(String(refused?.message)).toMatch(/U\+0000/);
  });

  it("no tool argument that reaches a path or a command line may hold U+0000 (spawn and fs throw TypeError on it)", async () => {
    const tools = createChildTools({
      workDir,
      scope: scopeFor({ deny: CHILD_TOOL_NAMES.map((n) => `${n}(*)`) }),
    });
    const cases: [string, Record<string, unknown>][] = [
      ["read", { path: "a\u0000" }],
      ["write", { path: "a\u0000", content: "x" }],
      ["edit", { path: "a\u0000", oldText: "x", newText: "y" }],
      ["shell", { command: "ls\u0000" }],
      ["ls", { path: "a\u0000" }],
      ["find", { pattern: "*\u0000" }],
      ["grep", { pattern: "a\u0000" }],
      ["grep", { pattern: "a", glob: "*\u0000" }],
    ];
    for (const [name, args] of cases) {
      const tool = tools.find((t) => t.name === name);
      const refused = await tool?.execute("call-1", args as never).catch((e) => e);
      expect(refused, name).toBeInstanceOf(ZodError);
    }
    // File content may hold any character.
    expect(() =>
      checkChildToolCall({ workDir, scope: scopeFor({ deny: [] }) }, "write", {
        path: "a",
        content: "\u0000",
      }),
    ).not.toThrow();
  });
});
