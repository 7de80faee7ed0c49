import { timeWithin } from "@crw/tools/timing";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { stringify as toYaml } from "yaml";
import { outputSchemaProblem } from "../src/definition/outputSchema.js";
import {
  DEFINITION_LIMITS,
  findCycle,
  parseWorkflowDefinition,
  validateAddedNodes,
  type WorkflowDefinition,
  WorkflowDefinitionError,
  WorkflowDefinitionSchema,
} from "../src/index.js";

/**
 * Fuzzing the workflow definition parser (`parseWorkflowDefinition`, what `workflow.start` and WorkflowStart
 * call) and the node list WorkflowAddNodes validates (`validateAddedNodes`). Every case is either one typed
 * `WorkflowDefinitionError` or a definition the schema and the graph check accept, in bounded time, and a
 * refusal never quotes a value of the text it refuses (the marker planted in values never shows).
 */
const RUNS = Number(process.env.CRW_FUZZ_RUNS ?? 10_000);
/** Per case on a small or medium text (a few KB); generous for a loaded 2-core machine. */
const CASE_BUDGET_MS = 200;
/** Per case on a text near the 256 KiB limit: linear work only (a 256 KiB YAML parse is ~100-300 ms here). */
const LARGE_CASE_BUDGET_MS = 2_000;
const LARGE_RUNS = Math.max(16, Math.round(RUNS / 400));
/**
 * A case's bound grows with its text at the large cases' linear rate: a generated text of tens of KB (a map
 * of thousands of keys) is linear work, not a small case; quadratic work still overruns it by far.
 */
const budgetFor = (text: string) =>
  CASE_BUDGET_MS + (LARGE_CASE_BUDGET_MS * Buffer.byteLength(text)) / DEFINITION_LIMITS.bytes;

const CODES = new Set([
  "definition_unreadable",
  "definition_too_large",
  "definition_changed",
  "definition_syntax",
  "definition_invalid",
  "duplicate_node",
  "unknown_dependency",
  "dependency_cycle",
  "too_many_nodes",
]);
/** Planted in values and unknown keys (never in node ids, which refusals may name): must never be quoted. */
const MARK = "Qz7SECRETxv";

const controlChar = fc.integer({ min: 0, max: 0x1f }).map((c) => String.fromCharCode(c));
/** Strings at and past the bounds: each costs a 32 KiB text, so they come in as one near-miss, not per field. */
const longString = fc.constantFrom(
  "a".repeat(129),
  "t".repeat(DEFINITION_LIMITS.taskLength),
  "t".repeat(DEFINITION_LIMITS.taskLength + 1),
  `${MARK}`.repeat(500),
);
const hostileString = fc.oneof(
  { weight: 12, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 6, arbitrary: fc.string({ unit: "binary", maxLength: 12 }) },
  { weight: 3, arbitrary: fc.constant(MARK) },
  { weight: 3, arbitrary: fc.string({ maxLength: 6 }).map((s) => `${s}${MARK}${s}`) },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      "x\u0000y",
      "\u0000",
      "\uD800",
      "\uDFFF\uD800",
      "\u202E",
      "\u2028",
      "\uFEFF",
      "",
    ),
  },
  { weight: 3, arbitrary: fc.array(controlChar, { maxLength: 4 }).map((cs) => `${MARK}${cs.join("")}`) },
);
/** A value of the wrong type for any field, with the marker where it can hide. */
const wrongValue = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fc.constantFrom(null, true, -1, 0, 1.5, 1e308, -0, [], {}, [MARK], { [MARK]: MARK }),
);

const plainIds = ["a", "b", "c", "d", "e", "f"];
const nodeIdArb = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom(...plainIds) },
  fc.constantFrom("", "-a", "a b", ".x", "a/b", "x".repeat(64), "x".repeat(65), "a\u0000", "ä", "__proto__"),
);
const agentTypeArb = fc.oneof(
  fc.constantFrom("coder", "reviewer", "x"),
  fc.constantFrom(
    "__proto__",
    "constructor",
    "toString",
    "hasOwnProperty",
    "valueOf",
    "isPrototypeOf",
    "__defineGetter__",
    "propertyIsEnumerable",
    "",
    "a b",
    "x".repeat(129),
    `${MARK}!`,
  ),
);
const toolEntryArb = fc.oneof(
  fc.constantFrom("read", "shell(git *)", "*", "mcp__*", "Bash(ls)", "write(src/*)"),
  fc.constantFrom(
    "shell(\n)",
    "shell(\u0000)",
    "shell(\r)",
    "sh\u0007ell",
    "a(b",
    "a)",
    "()",
    "(x)",
    `shell(${"x".repeat(512)})`,
    `shell(${"x".repeat(513)})`,
    "x".repeat(129),
    "\u0085",
    `${MARK}(\u0001)`,
    " read",
    "read ",
  ),
  fc
    .tuple(fc.string({ maxLength: 6 }), fc.array(controlChar, { maxLength: 3 }))
    .map(([s, cs]) => `shell(${s}${cs.join("")})`),
);
const patternArb = fc.constantFrom(
  "^(a+)+$",
  "(a|aa)+$",
  "(a)\\1",
  "(?=a)b",
  "(?<!a)b",
  "(?<n>a)\\k<n>",
  "[",
  "\\",
  "(",
  "a{99999}",
  "a{2,1}",
  "\\p{L}+",
  "[\\d-z]",
  "^.*$",
  `${MARK}(`,
  "",
);
/** A JSON Schema nested `depth` levels through `properties`. */
const deepSchema = (depth: number): Record<string, unknown> => {
  let schema: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < depth; i++) schema = { type: "object", properties: { [`k${i}`]: schema } };
  return schema;
};
const outputSchemaArb = fc.oneof(
  fc.record({ type: fc.constant("string"), pattern: patternArb }),
  fc.record({
    type: fc.constant("object"),
    patternProperties: fc.dictionary(patternArb, fc.constant({ type: "number" }), { maxKeys: 2 }),
    additionalProperties: fc.boolean(),
  }),
  fc.integer({ min: 0, max: 40 }).map(deepSchema),
  fc.dictionary(fc.constantFrom("type", "properties", "items", "enum", "pattern", MARK), wrongValue, {
    maxKeys: 4,
  }),
  fc.constantFrom({ type: "nonsense" }, { $ref: "#/definitions/x" }, { allOf: [{ not: {} }] }),
  wrongValue,
);

function maybeWrong<T>(valid: fc.Arbitrary<T>): fc.Arbitrary<unknown> {
  return fc.oneof({ weight: 6, arbitrary: valid }, { weight: 1, arbitrary: wrongValue });
}

const nodeArb = fc
  .record(
    {
      id: maybeWrong(nodeIdArb),
      task: maybeWrong(fc.oneof(fc.constant("do it"), hostileString)),
      role: maybeWrong(hostileString),
      agentType: maybeWrong(agentTypeArb),
      model: maybeWrong(hostileString),
      dependsOn: maybeWrong(fc.array(nodeIdArb, { maxLength: 4 })),
      cwd: maybeWrong(fc.oneof(hostileString, fc.constantFrom("..", "/", "../../etc", "sub/dir"))),
      isolation: maybeWrong(fc.constantFrom("none", "worktree", "container", MARK)),
      tools: maybeWrong(
        fc.record(
          {
            allow: fc.array(toolEntryArb, { maxLength: 3 }),
            deny: fc.array(toolEntryArb, { maxLength: 3 }),
            [MARK]: fc.constant(1),
          },
          { requiredKeys: [] },
        ),
      ),
      readOnly: maybeWrong(fc.boolean()),
      outputSchema: outputSchemaArb,
      [MARK]: hostileString,
    },
    { requiredKeys: [] },
  )
  .chain((n) =>
    // Mostly nodes that have their two required members, so the later checks are reached.
    fc
      .tuple(fc.constantFrom(...plainIds), fc.boolean())
      .map(([id, keepRaw]) => (keepRaw ? n : { id, task: "t", ...n })),
  );

const definitionArb = fc.record(
  {
    version: fc.oneof({ weight: 4, arbitrary: fc.constant(1) }, fc.constantFrom(2, "1", 0, null)),
    name: maybeWrong(fc.oneof(fc.constant("wf"), hostileString)),
    description: maybeWrong(hostileString),
    defaults: maybeWrong(
      fc.record(
        { model: hostileString, agentType: agentTypeArb, [MARK]: fc.constant(1) },
        { requiredKeys: [] },
      ),
    ),
    agentTypes: maybeWrong(
      fc.dictionary(
        agentTypeArb,
        fc.oneof(fc.record({ model: hostileString }), wrongValue, fc.constant({ model: "m", [MARK]: 1 })),
        { maxKeys: 3 },
      ),
    ),
    maxDispatches: fc.constantFrom(1, 10_000, 10_001, 0, -1, 1.5, 1e308, "5"),
    nodes: fc.oneof(
      { weight: 8, arbitrary: fc.array(nodeArb, { minLength: 1, maxLength: 6 }) },
      fc.constant([]),
      wrongValue,
    ),
    [MARK]: hostileString,
  },
  { requiredKeys: ["name", "nodes"] },
);

/** Valid definitions: unique ids, dependencies only on earlier nodes (a DAG), valid entries and schemas. */
const validDefinitionArb = fc
  .uniqueArray(fc.constantFrom(...plainIds), { minLength: 1, maxLength: 6 })
  .chain((ids) =>
    fc.record(
      {
        name: fc.constantFrom("wf", "review"),
        agentTypes: fc.dictionary(
          fc.constantFrom("coder", "reviewer"),
          fc.record({ model: fc.constant("m") }),
          {
            maxKeys: 2,
          },
        ),
        maxDispatches: fc.integer({ min: 1, max: 10_000 }),
        nodes: fc.tuple(
          ...ids.map((id, i) =>
            fc.record(
              {
                id: fc.constant(id),
                task: fc.constantFrom("t", "review it", `a task ${MARK}`),
                dependsOn: fc.subarray(ids.slice(0, i)),
                agentType: fc.constantFrom("coder", "reviewer"),
                model: fc.constantFrom("scripted", "m"),
                cwd: fc.constantFrom("sub", "."),
                tools: fc.record(
                  {
                    allow: fc.subarray(["read", "shell(git *)", "*", "mcp__gh__*", "write(src/*)"]),
                    deny: fc.subarray(["shell(rm *)", "write"]),
                  },
                  { requiredKeys: [] },
                ),
                readOnly: fc.boolean(),
                outputSchema: fc.constantFrom(
                  { type: "string", pattern: "^(a+)+$" },
                  { type: "object", patternProperties: { "^(a|aa)+$": { type: "number" } } },
                  { type: "object" },
                  deepSchema(8),
                ),
              },
              { requiredKeys: ["id", "task", "dependsOn"] },
            ),
          ),
        ),
      },
      { requiredKeys: ["name", "nodes"] },
    ),
  );

/** One near-miss: a single field made wrong, an edge that closes a cycle, a repeated id, an extra key. */
const mutationArb = fc.record({
  kind: fc.constantFrom(
    "node field",
    "cycle",
    "self dependency",
    "unknown dependency",
    "repeated id",
    "top field",
    "unknown key",
    "prototype agent type",
  ),
  at: fc.nat(),
  field: fc.constantFrom(
    "id",
    "task",
    "role",
    "agentType",
    "model",
    "dependsOn",
    "cwd",
    "isolation",
    "tools",
    "readOnly",
    "outputSchema",
  ),
  top: fc.constantFrom("version", "name", "description", "defaults", "agentTypes", "maxDispatches", "nodes"),
  value: fc.oneof(
    hostileString,
    longString,
    wrongValue,
    agentTypeArb,
    outputSchemaArb,
    fc.array(toolEntryArb, { maxLength: 2 }),
  ),
  proto: agentTypeArb,
});
type Mutation = typeof mutationArb extends fc.Arbitrary<infer T> ? T : never;

function mutate(
  definition: Record<string, unknown>,
  mutations: readonly Mutation[],
): Record<string, unknown> {
  const def = structuredClone(definition) as Record<string, unknown> & { nodes: Record<string, unknown>[] };
  const own = (o: Record<string, unknown>, key: string, value: unknown) =>
    Object.defineProperty(o, key, { value, enumerable: true, writable: true, configurable: true });
  for (const m of mutations) {
    const nodes = def.nodes;
    // an earlier mutation may have made `nodes` something else: the rest only change the top level
    if (
      !Array.isArray(nodes) ||
      nodes.length === 0 ||
      nodes.some((n) => typeof n !== "object" || n === null)
    ) {
      own(def, m.top, m.value);
      continue;
    }
    const node = nodes[m.at % nodes.length] as Record<string, unknown>;
    const last = nodes[nodes.length - 1] as Record<string, unknown>;
    switch (m.kind) {
      case "node field":
        // refusals name node ids (valid identifiers the caller chose): the marker stays out of them
        own(
          node,
          m.field,
          m.field === "id" || m.field === "dependsOn"
            ? JSON.parse(JSON.stringify(m.value ?? null).replaceAll(MARK, "mk"))
            : m.value,
        );
        break;
      case "cycle":
        // the first node depends on the last one, which (transitively) may depend on it
        (nodes[0] as { dependsOn: unknown[] }).dependsOn = [last.id];
        if (nodes.length > 1) (last as { dependsOn: unknown[] }).dependsOn = [nodes[0]?.id];
        break;
      case "self dependency":
        node.dependsOn = [node.id];
        break;
      case "unknown dependency":
        node.dependsOn = ["zz"];
        break;
      case "repeated id":
        node.id = nodes[0]?.id;
        break;
      case "top field":
        own(def, m.top, m.value);
        break;
      case "unknown key":
        own(m.at % 2 ? def : node, m.at % 3 ? MARK : "__proto__", m.value);
        break;
      case "prototype agent type": {
        const types = { ...((def.agentTypes as Record<string, unknown> | undefined) ?? {}) };
        own(types, m.proto, { model: "m" });
        def.agentTypes = types;
        node.agentType = m.proto;
        break;
      }
    }
  }
  return def;
}

/** YAML token soup: mostly syntax errors, some odd valid documents (anchors, tags, block scalars). */
const yamlSoup = fc
  .array(
    fc.constantFrom(
      "[",
      "]",
      "{",
      "}",
      ":",
      ": ",
      "- ",
      " ",
      "  ",
      "\n",
      "\t",
      "'",
      '"',
      "#",
      "&a ",
      "*a",
      "!!str ",
      "!!binary ",
      "!<tag:x> ",
      "|\n",
      ">-\n",
      "%YAML 1.2\n",
      "---\n",
      "...\n",
      "? ",
      "<<: *a\n",
      "name",
      "nodes",
      "id",
      "task",
      "a",
      MARK,
      "\u0000",
      "\\0",
      "\\u0000",
      "\uFEFF",
    ),
    { maxLength: 60 },
  )
  .map((parts) => parts.join(""));

const textCase = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .tuple(
        validDefinitionArb,
        fc.array(mutationArb, { maxLength: 2 }),
        fc.constantFrom("json", "yaml") as fc.Arbitrary<"json" | "yaml">,
      )
      .map(([def, mutations, as]) => {
        const value = mutate(def, mutations);
        return { text: as === "json" ? JSON.stringify(value) : toYaml(value), as };
      }),
  },
  {
    weight: 3,
    arbitrary: fc
      .tuple(definitionArb, fc.constantFrom("json", "yaml") as fc.Arbitrary<"json" | "yaml">)
      .map(([def, as]) => ({ text: as === "json" ? JSON.stringify(def) : toYaml(def), as })),
  },
  { weight: 2, arbitrary: yamlSoup.map((text) => ({ text, as: "yaml" as const })) },
  {
    weight: 1,
    arbitrary: fc
      .string({ unit: "binary", maxLength: 200 })
      .map((text) => ({ text: `${text}${MARK}`, as: "yaml" as const })),
  },
  {
    weight: 1,
    arbitrary: fc
      .jsonValue({ maxDepth: 4 })
      .map((v) => ({ text: JSON.stringify(v) ?? "null", as: "json" as const })),
  },
  {
    weight: 1,
    arbitrary: fc.integer({ min: 40, max: 200 }).map((d) => ({
      // Deep flow nesting, and the same nesting inside an outputSchema.
      text: `{"name":"n","nodes":[{"id":"a","task":"t","outputSchema":${"[".repeat(d)}${"]".repeat(d)}}]}`,
      as: "json" as const,
    })),
  },
);

type Outcome = { ok: WorkflowDefinition } | { error: unknown };

function timed(
  fn: () => WorkflowDefinition,
  boundMs: number,
  tries?: number,
): { outcome: Outcome; ms: number } {
  return timeWithin(fn, boundMs, tries);
}

/** A refusal is one typed error with a known code whose message quotes nothing it was given. */
function expectTypedRefusal(error: unknown, source?: string): void {
  if (!(error instanceof WorkflowDefinitionError))
    throw new Error(`untyped throw: ${(error as Error)?.name}: ${(error as Error)?.message}`);
  expect(CODES.has(error.code), error.code).toBe(true);
  expect(error.message).not.toContain(MARK);
  expect(error.message).not.toContain("\u0000");
  if (source === undefined) expect(error.message).not.toContain("passwd");
}

/** An accepted definition is one the schema accepts again: unique ids, known dependencies, a DAG. */
function expectValid(def: WorkflowDefinition): void {
  expect(WorkflowDefinitionSchema.safeParse(def).success).toBe(true);
  const ids = new Set(def.nodes.map((n) => n.id));
  expect(ids.size).toBe(def.nodes.length);
  for (const n of def.nodes) for (const dep of n.dependsOn) expect(ids.has(dep)).toBe(true);
  expect(findCycle(def.nodes)).toBeUndefined();
  expect(JSON.stringify(def)).not.toMatch(/\\u0000/);
  for (const key of Object.keys(def.agentTypes)) expect(key in Object.prototype).toBe(false);
  // An accepted output schema can be used on an answer without a throw or a stall (RE2 patterns).
  for (const n of def.nodes)
    if (n.outputSchema) {
      const schema = n.outputSchema;
      const { outcome, ms } = timeWithin(
        () => outputSchemaProblem(schema, JSON.stringify(`${"a".repeat(28)}!`)),
        CASE_BUDGET_MS,
      );
      expect("ok" in outcome && (outcome.ok === undefined || typeof outcome.ok === "string")).toBe(true);
      expect(ms).toBeLessThan(CASE_BUDGET_MS);
    }
}

describe("fuzzing workflow definitions", () => {
  it(`every generated definition text is a typed refusal or a valid definition, each within ${CASE_BUDGET_MS} ms plus linear time in its size (${RUNS} cases)`, () => {
    let accepted = 0;
    fc.assert(
      fc.property(
        textCase,
        fc.constantFrom("json", "yaml") as fc.Arbitrary<"json" | "yaml">,
        fc.option(fc.constantFrom("flows/review.yaml", "../../etc/passwd"), { nil: undefined }),
        fc.boolean(),
        ({ text, as }, other, source, sameFormat) => {
          const format = sameFormat ? as : other;
          const { outcome, ms } = timed(() => parseWorkflowDefinition(text, format, source), budgetFor(text));
          expect(ms, `case took ${Math.round(ms)} ms`).toBeLessThan(budgetFor(text));
          if ("ok" in outcome) {
            accepted++;
            expectValid(outcome.ok);
          } else expectTypedRefusal(outcome.error, source);
        },
      ),
      { numRuns: RUNS },
    );
    // The generator must reach the accepting side too, or the graph checks are never exercised.
    expect(accepted).toBeGreaterThan(RUNS / 50);
  }, 240_000);

  it(`nodes a running workflow adds are a typed refusal or valid new nodes (${RUNS} cases)`, () => {
    const existing = parseWorkflowDefinition(
      JSON.stringify({
        name: "w",
        nodes: [
          { id: "a", task: "t" },
          { id: "b", task: "t", dependsOn: ["a"] },
        ],
      }),
      "json",
    ).nodes;
    fc.assert(
      fc.property(
        fc.oneof(fc.array(nodeArb, { minLength: 0, maxLength: 5 }), wrongValue),
        fc.integer({ min: 0, max: 10 }),
        (raw, limit) => {
          const { outcome, ms } = timeWithin(() => validateAddedNodes(existing, raw, limit), CASE_BUDGET_MS);
          const added = "ok" in outcome ? outcome.ok : undefined;
          if ("error" in outcome) expectTypedRefusal(outcome.error);
          expect(ms).toBeLessThan(CASE_BUDGET_MS);
          if (added) {
            expect(existing.length + added.length).toBeLessThanOrEqual(limit);
            const ids = new Set(existing.map((n) => n.id));
            for (const n of added) {
              expect(ids.has(n.id)).toBe(false);
              ids.add(n.id);
            }
            for (const n of added) for (const dep of n.dependsOn) expect(ids.has(dep)).toBe(true);
            expect(findCycle([...existing, ...added])).toBeUndefined();
          }
        },
      ),
      { numRuns: RUNS },
    );
  }, 240_000);

  /** Texts near the byte limit, built to find super-linear work: many keys, deep blocks, many issues. */
  const largeText = fc
    .tuple(
      fc.constantFrom(
        "root keys",
        "node keys",
        "block sequence",
        "hidden flow",
        "many issues",
        "anchors",
        "long scalar",
        "schema values",
      ),
      fc.integer({ min: 150_000, max: DEFINITION_LIMITS.bytes - 64 }),
      fc.constantFrom("json", "yaml") as fc.Arbitrary<"json" | "yaml">,
    )
    // The text is built in the predicate: a counterexample is reported as its recipe, not 256 KiB of text.
    .map(([kind, bytes, format]) => ({ kind, bytes, format }));

  it(`definitions near the size limit are refused or accepted in linear time: within ${LARGE_CASE_BUDGET_MS} ms, or 24 × an eighth-size one's time (${LARGE_RUNS} cases)`, () => {
    fc.assert(
      fc.property(largeText, ({ kind, bytes, format }) => {
        const outcome = linearRead(kind, bytes, format);
        if ("ok" in outcome) expectValid(outcome.ok);
        else expectTypedRefusal(outcome.error);
      }),
      { numRuns: LARGE_RUNS },
    );
  }, 240_000);
});

describe("regressions the definition fuzz found", () => {
  it("a YAML definition of 150 KB with 15,000 keys is refused in linear time (yaml's uniqueKeys compared every key with every earlier one: 6.5 s)", () => {
    const outcome = linearRead("root keys", 150_000, "yaml");
    expect((outcome as { error: WorkflowDefinitionError }).error).toMatchObject({
      code: "definition_invalid",
    });
  });

  it("duplicate keys are still refused at the repeated key, in block and flow maps at any depth", () => {
    const cases: [string, string][] = [
      ["name: a\nname: b\nnodes: [{id: a, task: t}]\n", "line 2, column 1"],
      ["name: n\nnodes:\n  - id: a\n    task: t\n    task: u\n", "line 5, column 5"],
      ["name: n\nnodes: [{id: a, task: t, id: b}]\n", "line 2, column 26"],
      ["true: 1\nTrue: 2\n", "line 2, column 1"],
      ["0x1: a\n1: b\n", "line 2, column 1"],
    ];
    for (const [text, place] of cases) {
      const { outcome } = timed(() => parseWorkflowDefinition(text, "yaml"), LARGE_CASE_BUDGET_MS);
      const error = (outcome as { error: WorkflowDefinitionError }).error;
      expect(error, text).toBeInstanceOf(WorkflowDefinitionError);
      expect(error.code).toBe("definition_syntax");
      expect(error.message).toContain(`at ${place} (DUPLICATE_KEY)`);
    }
    // Keys that differ as values are different keys, as before (a number and a string, NaN twice).
    for (const text of ["1: a\n'1': b\n", ".nan: 1\n.nan: 2\n"]) {
      const { outcome } = timed(() => parseWorkflowDefinition(text, "yaml"), LARGE_CASE_BUDGET_MS);
      expect((outcome as { error: WorkflowDefinitionError }).error.code).toBe("definition_invalid");
    }
  });

  it("a definition whose YAML yaml warns about (a collection as a key) prints nothing to the process's warnings", async () => {
    const warnings: Error[] = [];
    const listener = (w: Error) => warnings.push(w);
    process.on("warning", listener);
    try {
      const { outcome } = timed(
        () => parseWorkflowDefinition(`name: n\nnodes: [{id: a, task: t}]\n? [${MARK}]\n: 1\n`),
        LARGE_CASE_BUDGET_MS,
      );
      expect((outcome as { error: WorkflowDefinitionError }).error.message).not.toContain(MARK);
      await new Promise((r) => setImmediate(r));
    } finally {
      process.off("warning", listener);
    }
    expect(warnings.map((w) => w.message).join("\n")).not.toContain(MARK);
  });
});

/**
 * Reads a large definition made by `largeDefinition`: within LARGE_CASE_BUDGET_MS of CPU time, or else in
 * no more than 24 × the time of an eighth-size definition of the same recipe (linear work takes about 8 × as
 * long, quadratic work 64 ×). The two are timed again in turns, the fastest of each kept, so that a burst of
 * other work slows both alike.
 */
function linearRead(kind: string, bytes: number, format: "json" | "yaml"): Outcome {
  const text = largeDefinition(kind, bytes, format);
  expect(Buffer.byteLength(text)).toBeLessThanOrEqual(DEFINITION_LIMITS.bytes);
  const full = timed(() => parseWorkflowDefinition(text, format), LARGE_CASE_BUDGET_MS);
  if (full.ms >= LARGE_CASE_BUDGET_MS) {
    const eighthText = largeDefinition(kind, Math.floor(bytes / 8), format);
    let fullMs = full.ms;
    let eighthMs = Number.POSITIVE_INFINITY;
    for (let turn = 0; turn < 3; turn++) {
      eighthMs = Math.min(eighthMs, timed(() => parseWorkflowDefinition(eighthText, format), 0, 1).ms);
      fullMs = Math.min(fullMs, timed(() => parseWorkflowDefinition(text, format), 0, 1).ms);
    }
    expect(
      fullMs,
      `${kind} ${format} ${bytes} bytes took ${Math.round(fullMs)} ms, an eighth of it ${Math.round(eighthMs)} ms`,
    ).toBeLessThan(24 * eighthMs);
  }
  return full.outcome;
}

function largeDefinition(kind: string, bytes: number, format: "json" | "yaml"): string {
  const head = "name: n\nnodes:\n  - id: a\n    task: t\n";
  const fill = (unit: (i: number) => string, prefix: string, suffix = "", maxUnits = Infinity) => {
    const parts: string[] = [];
    let size = prefix.length + suffix.length;
    for (let i = 0; i < maxUnits; i++) {
      const u = unit(i);
      if (size + u.length > bytes) break;
      parts.push(u);
      size += u.length;
    }
    return `${prefix}${parts.join("")}${suffix}`;
  };
  switch (kind) {
    case "root keys":
      return format === "json"
        ? fill((i) => `,"k${i}":1`, '{"name":"n","nodes":[{"id":"a","task":"t"}]', "}")
        : fill((i) => `k${i}: 1\n`, head);
    case "node keys":
      return format === "json"
        ? fill((i) => `,"k${i}":1`, '{"name":"n","nodes":[{"id":"a","task":"t"', "}]}")
        : fill((i) => `    k${i}: 1\n`, head);
    case "block sequence":
      return fill(() => "- ", `${head}    outputSchema:\n      x: `, "1\n");
    case "hidden flow": {
      // A quote inside a plain scalar starts no string in YAML, but a naive scanner skips what follows it.
      const half = Math.floor((bytes - 64) / 2);
      return `name: it's\nx: ${"[".repeat(half)}${"]".repeat(half)} #'\nnodes: [{id: a, task: t}]\n`;
    }
    case "many issues": {
      // At most the node limit, each node padded so the text is large: up to 8 issues are located.
      const pad = "r".repeat(Math.floor(bytes / DEFINITION_LIMITS.nodes) - 48);
      return format === "json"
        ? fill(
            (i) => `,{"id":"n${i}","task":1,"zz":1,"description":"${pad}"}`,
            '{"name":"n","nodes":[{"id":"a","task":"t"}',
            "]}",
            DEFINITION_LIMITS.nodes - 1,
          )
        : fill(
            (i) => `  - {id: n${i}, task: 1, zz: 1, role: ${pad}}\n`,
            "name: n\nnodes:\n",
            "",
            DEFINITION_LIMITS.nodes,
          );
    }
    case "anchors": {
      const pad = "t".repeat(Math.floor(bytes / DEFINITION_LIMITS.nodes) - 48);
      return fill(
        (i) => `  - {id: n${i}, task: &t${i} ${pad}, role: *t${i}}\n`,
        "name: n\nnodes:\n",
        "",
        DEFINITION_LIMITS.nodes,
      );
    }
    case "schema values": {
      // Around the output schema's 4096-value bound.
      const n = 4090 + (bytes % 12);
      const schema = { type: "array", items: { enum: Array.from({ length: n }, (_, i) => i) } };
      const def = { name: "n", nodes: [{ id: "a", task: "t", outputSchema: schema }] };
      return format === "json" ? JSON.stringify(def) : toYaml(def);
    }
    default:
      return format === "json"
        ? `{"name":"n","nodes":[{"id":"a","task":"${"t".repeat(bytes - 64)}"}]}`
        : `${head}    role: ${"r".repeat(bytes - 64)}\n`;
  }
}
