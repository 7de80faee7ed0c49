import { mkdir, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { timeWithin } from "@crw/tools/timing";
import { afterEach, describe, expect, it } from "vitest";
import { outputSchemaProblem } from "../src/definition/outputSchema.js";
import {
  boundedProjectFileReader,
  parseWorkflowDefinition,
  validateAddedNodes,
  WorkflowDefinitionError,
  type WorkflowEngine,
} from "../src/index.js";
import { taskLine, world } from "./helpers.js";

const db = useTestDatabase();
const all: WorkflowEngine[] = [];
afterEach(async () => {
  await Promise.all(all.splice(0).map((e) => e.close()));
});

function refusal(fn: () => unknown): WorkflowDefinitionError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(WorkflowDefinitionError);
    return e as WorkflowDefinitionError;
  }
  throw new Error("expected a refusal");
}

const def = (node: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ name: "x", ...extra, nodes: [{ id: "a", task: "t", ...node }] });

const EVIL = "^(a+)+$";
const EVIL_ANSWER = JSON.stringify(`${"a".repeat(28)}!`); // 31 characters of JSON text

describe("security: output schema patterns (finding 2)", () => {
  it("a catastrophic pattern against the 31-character answer returns within 100 ms of CPU time with the right verdict", () => {
    expect(EVIL_ANSWER.length).toBe(31);
    const schema = { type: "string", pattern: EVIL };
    // CPU time, the fastest of up to three runs: a backtracking engine takes seconds on every run
    const failing = timeWithin(() => outputSchemaProblem(schema, EVIL_ANSWER), 100);
    expect(failing.outcome).toEqual({ ok: expect.stringMatching(/does not match/) });
    expect(failing.ms).toBeLessThan(100);
    const passing = timeWithin(() => outputSchemaProblem(schema, JSON.stringify("a".repeat(29))), 100);
    expect(passing.outcome).toEqual({ ok: undefined });
    expect(passing.ms).toBeLessThan(100);
  });

  it("patternProperties keys (also with additionalProperties: false) run on the same linear engine", () => {
    outputSchemaProblem({ type: "object", patternProperties: { a: {} } }, "{}"); // warm the converter
    const schema = {
      type: "object",
      patternProperties: { [EVIL]: { type: "number" } },
      additionalProperties: false,
    };
    const both = timeWithin(
      () => [
        outputSchemaProblem(schema, JSON.stringify({ [`${"a".repeat(29)}!`]: 1 })),
        outputSchemaProblem(schema, JSON.stringify({ aaaa: 1 })),
      ],
      100,
    );
    expect(both.outcome).toEqual({ ok: [expect.any(String), undefined] });
    expect(both.ms).toBeLessThan(100);
  });

  it("refuses at definition time a pattern the linear engine cannot run (backreference, lookaround)", () => {
    for (const pattern of ["(a)\\1", "(?=a)b", "(?<!a)b"]) {
      const e = refusal(() =>
        parseWorkflowDefinition(def({ outputSchema: { type: "string", pattern } }), "json"),
      );
      expect(e.code).toBe("definition_invalid");
      expect(e.message).toContain("outputSchema");
    }
    const e = refusal(() =>
      parseWorkflowDefinition(
        def({ outputSchema: { type: "object", patternProperties: { "(?=x)": {} } } }),
        "json",
      ),
    );
    expect(e.code).toBe("definition_invalid");
  });

  it("through the engine: the node's 31-character answer fails the schema without freezing the daemon", async () => {
    const w = await world(db.pool);
    const definition = parseWorkflowDefinition(
      JSON.stringify({
        name: "redos",
        nodes: [
          { id: "bad", task: "TASK bad", outputSchema: { type: "string", pattern: EVIL } },
          { id: "good", task: "TASK good", outputSchema: { type: "string", pattern: EVIL } },
        ],
      }),
      "json",
    );
    const { engine } = await w.engine(({ task }) =>
      taskLine(task) === "TASK bad" ? EVIL_ANSWER : JSON.stringify("aaaa"),
    );
    all.push(engine);
    const t = performance.now();
    const started = await engine.start(w.ctx(), { definition });
    const outcome = await engine.finished(started.workflowId);
    expect(performance.now() - t).toBeLessThan(5_000);
    expect(outcome.summary).toMatch(/- bad: failed: the answer does not match the output schema/);
    expect(outcome.summary).toContain("- good: succeeded");
  });
});

describe("security: U+0000 in a definition (finding 8)", () => {
  it("refuses U+0000 in any string of a definition with definition_invalid naming the field", () => {
    const cases: Array<[Record<string, unknown>, Record<string, unknown>, string]> = [
      [{ task: "do\u0000it" }, {}, "nodes.0.task"],
      [{ cwd: "sub\u0000dir" }, {}, "nodes.0.cwd"],
      [{ model: "m\u0000" }, {}, "nodes.0.model"],
      [{ role: "r\u0000" }, {}, "nodes.0.role"],
      [{ tools: { deny: ["Read", "Bash(\u0000)"] } }, {}, "nodes.0.tools.deny.1"],
      [{ outputSchema: { type: "string", description: "x\u0000" } }, {}, "nodes.0.outputSchema"],
      [{}, { description: "d\u0000" }, "description"],
      [{}, { name: "n\u0000" }, "name"],
      [{}, { agentTypes: { r: { model: "m\u0000" } } }, "agentTypes"],
    ];
    for (const [node, extra, field] of cases) {
      const e = refusal(() => parseWorkflowDefinition(def(node, extra), "json"));
      expect(e.code).toBe("definition_invalid");
      expect(e.message).toContain(field);
      expect(e.message).toContain("U+0000");
    }
    const id = refusal(() => parseWorkflowDefinition(def({ id: "a\u0000" }), "json"));
    expect(id.code).toBe("definition_invalid");
    const added = refusal(() => validateAddedNodes([], [{ id: "b", task: "x\u0000y" }], 500));
    expect(added.code).toBe("definition_invalid");
    expect(added.message).toContain("0.task");
  });

  it("a refused U+0000 definition creates nothing: no workflow row, no child", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => "never");
    all.push(engine);
    const root = scratchDir("crw-wf-");
    await writeFile(join(root, "nul.json"), def({ task: "do\u0000it" }));
    const before = await db.pool.query(
      "select (select count(*) from workflows) w, (select count(*) from sessions) s",
    );
    await expect(
      engine.start(w.ctx(), { path: "nul.json", reader: boundedProjectFileReader({ root }) }),
    ).rejects.toMatchObject({ name: "WorkflowDefinitionError", code: "definition_invalid" });
    const after = await db.pool.query(
      "select (select count(*) from workflows) w, (select count(*) from sessions) s",
    );
    expect(after.rows).toEqual(before.rows);
  });
});

describe("security: agent type names (finding 9)", () => {
  it("refuses an agentType that is an Object.prototype member or not a plain name", () => {
    for (const agentType of ["constructor", "toString", "__proto__", "hasOwnProperty", "a b", "x\n"]) {
      expect(refusal(() => parseWorkflowDefinition(def({ agentType }), "json")).code).toBe(
        "definition_invalid",
      );
      expect(refusal(() => parseWorkflowDefinition(def({}, { defaults: { agentType } }), "json")).code).toBe(
        "definition_invalid",
      );
    }
    const key = refusal(() =>
      parseWorkflowDefinition(
        '{"name":"x","agentTypes":{"constructor":{"model":"m"}},"nodes":[{"id":"a","task":"t"}]}',
        "json",
      ),
    );
    expect(key.code).toBe("definition_invalid");
    expect(parseWorkflowDefinition(def({ agentType: "reviewer-2.fast" }), "json").nodes[0]?.agentType).toBe(
      "reviewer-2.fast",
    );
  });

  it("a node of an agent type without a pin runs on the default model, never an Object.prototype member", async () => {
    const w = await world(db.pool);
    const definition = parseWorkflowDefinition(
      def({ id: "valueOf", agentType: "plain" }, { agentTypes: {} }),
      "json",
    );
    const { engine } = await w.engine(() => "done");
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition });
    const outcome = await engine.finished(started.workflowId);
    expect(outcome.status).toBe("completed");
    expect(outcome.summary).toContain("- valueOf: succeeded");
  });
});

describe("security: tool entries and output schema bounds (finding 16)", () => {
  it("refuses tool entries that are not tool-name shaped at definition time", () => {
    for (const entry of ["read\n", "", "a b", "Bash(git\n)", "Read)", "r\u0000"]) {
      for (const key of ["allow", "deny"]) {
        expect(refusal(() => parseWorkflowDefinition(def({ tools: { [key]: [entry] } }), "json")).code).toBe(
          "definition_invalid",
        );
      }
    }
    const ok = parseWorkflowDefinition(
      def({ tools: { allow: ["read", "Bash(git *)", "mcp.server:tool", "*"], deny: ["write"] } }),
      "json",
    );
    expect(ok.nodes[0]?.tools?.allow).toHaveLength(4);
  });

  it("a 5,000-level nested outputSchema is refused with a typed error, no RangeError", () => {
    // Built as text: JSON.stringify itself overflows the stack at this depth.
    const schema = `${'{"type":"array","items":'.repeat(5000)}{"type":"string"}${"}".repeat(5000)}`;
    const text = `{"name":"x","nodes":[{"id":"a","task":"t","outputSchema":${schema}}]}`;
    for (const format of ["json", "yaml"] as const) {
      const e = refusal(() => parseWorkflowDefinition(text, format));
      expect(["definition_invalid", "definition_syntax"]).toContain(e.code);
    }
    expect(refusal(() => parseWorkflowDefinition(text, "json")).message).toMatch(/outputSchema.*deep/);
    const shallow = { type: "object", properties: { a: { type: "array", items: { type: "string" } } } };
    expect(parseWorkflowDefinition(def({ outputSchema: shallow }), "json").nodes[0]?.outputSchema).toEqual(
      shallow,
    );
    const wide = { type: "object", enum: Array.from({ length: 20_000 }, (_, i) => i) };
    expect(refusal(() => parseWorkflowDefinition(def({ outputSchema: wide }), "json")).message).toMatch(
      /outputSchema.*large/,
    );
  });
});

describe("security: WorkflowStart path disclosure (finding 12)", () => {
  async function project() {
    const base = scratchDir("crw-wf-sec-");
    const root = join(base, "project");
    const outside = join(base, "outside");
    await mkdir(root);
    await mkdir(outside);
    await writeFile(join(outside, "secret.yaml"), "name: s\nnodes: [{id: a, task: t}]\n");
    await writeFile(join(root, "wf.yaml"), "name: s\nnodes: [{id: a, task: t}]\n");
    await symlink(join(outside, "secret.yaml"), join(root, "link.yaml"));
    await symlink("wf.yaml", join(root, "inner-link.yaml"));
    return { base, root, outside };
  }

  it("an outside path gets one error, whether or not it exists, naming the path only as given", async () => {
    const { base, root } = await project();
    const reader = boundedProjectFileReader({ root });
    const errors: WorkflowDefinitionError[] = [];
    for (const path of ["../outside/secret.yaml", "../outside/missing.yaml", "link.yaml"]) {
      const e = (await reader.readProjectFile(path).catch((x: unknown) => x)) as WorkflowDefinitionError;
      expect(e).toBeInstanceOf(WorkflowDefinitionError);
      expect(e.code).toBe("definition_unreadable");
      expect(e.message).toContain(path);
      expect(e.message).not.toContain(base);
      expect(JSON.stringify(e.context)).not.toContain(base);
      expect(e.cause).toBeUndefined();
      errors.push(e);
    }
    expect(errors[0]?.message.replace("secret", "missing")).toBe(errors[1]?.message);
    expect(errors[2]?.message.replace("link.yaml", "x")).toBe(
      errors[0]?.message.replace("../outside/secret.yaml", "x"),
    );
  });

  it("files inside are read, symbolic links inside resolve, and a missing inside file names no absolute path", async () => {
    const { base, root } = await project();
    const reader = boundedProjectFileReader({ root });
    await expect(reader.readProjectFile("inner-link.yaml")).resolves.toMatchObject({ byteSize: 34 });
    await expect(reader.readProjectFile("sub/../wf.yaml")).resolves.toMatchObject({ byteSize: 34 });
    const e = (await reader.readProjectFile("nope.yaml").catch((x: unknown) => x)) as WorkflowDefinitionError;
    expect(e.code).toBe("definition_unreadable");
    expect(e.message).not.toContain(base);
  });
});

describe("security: definition errors quote no file text (finding 13)", () => {
  it("a YAML error names the file, line, column and kind, never the line's text", () => {
    const text = "name: x\nnodes:\n  - id: a\n    task: t\npassword=hunter2: [\n";
    const e = refusal(() => parseWorkflowDefinition(text, "yaml", "wf.yaml"));
    expect(e.code).toBe("definition_syntax");
    expect(e.message).not.toContain("hunter2");
    expect(e.message).toContain("wf.yaml");
    expect(e.message).toMatch(/line \d+, column \d+/);
    const json = refusal(() => parseWorkflowDefinition('{"name": "x", password=hunter2}', "json", "wf.json"));
    expect(json.code).toBe("definition_syntax");
    expect(json.message).not.toContain("hunter2");
    expect(json.message).toContain("wf.json");
  });

  it("a schema error names the file, line and kind, never unknown key names or values", () => {
    const text = "name: x\nnodes:\n  - id: a\n    task: t\n    password_hunter2: secret\n";
    const e = refusal(() => parseWorkflowDefinition(text, "yaml", "wf.yaml"));
    expect(e.code).toBe("definition_invalid");
    expect(e.message).not.toContain("hunter2");
    expect(e.message).not.toContain("secret");
    expect(e.message).toContain("wf.yaml");
    expect(e.message).toMatch(/line 5/);
    const key = refusal(() =>
      parseWorkflowDefinition("name: x\nagentTypes:\n  hunter2: { model: 7 }\nnodes: [{id: a, task: t}]\n"),
    );
    expect(key.message).not.toContain("hunter2");
  });
});
