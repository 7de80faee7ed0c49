import { createHash } from "node:crypto";
import { symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import {
  boundedProjectFileReader,
  DEFINITION_LIMITS,
  parseWorkflowDefinition,
  validateAddedNodes,
  WorkflowDefinitionError,
} from "../src/index.js";
import { world } from "./helpers.js";

const db = useTestDatabase();

function refusal(fn: () => unknown): WorkflowDefinitionError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(WorkflowDefinitionError);
    return e as WorkflowDefinitionError;
  }
  throw new Error("expected a refusal");
}

const yaml = `
name: review
defaults: { model: scripted }
agentTypes:
  reviewer: { model: scripted-large }
nodes:
  - id: survey
    task: Map the package.
  - id: review
    agentType: reviewer
    task: Review the survey.
    dependsOn: [survey]
    tools: { allow: ["Read", "Bash(git *)"], deny: ["Write"] }
    outputSchema: { type: object, properties: { ok: { type: boolean } }, required: [ok] }
`;

describe("workflow definitions", () => {
  it("one DAG definition parses from YAML or JSON into the same validated shape (S004-341)", () => {
    const fromYaml = parseWorkflowDefinition(yaml);
    const fromJson = parseWorkflowDefinition(JSON.stringify(fromYaml), "json");
    expect(fromJson).toEqual(fromYaml);
    expect(fromYaml.nodes.map((n) => n.id)).toEqual(["survey", "review"]);
    expect(fromYaml.nodes[1]?.dependsOn).toEqual(["survey"]);
    expect(fromYaml.agentTypes.reviewer?.model).toBe("scripted-large");
  });

  it("refuses duplicate ids, unknown dependencies, cycles, unknown fields and bad syntax with typed codes", () => {
    const node = (id: string, deps: string[] = []) => ({ id, task: "t", dependsOn: deps });
    const def = (nodes: unknown[]) => JSON.stringify({ name: "x", nodes });
    expect(refusal(() => parseWorkflowDefinition(def([node("a"), node("a")]), "json")).code).toBe(
      "duplicate_node",
    );
    const unknown = refusal(() => parseWorkflowDefinition(def([node("a", ["ghost"])]), "json"));
    expect(unknown.code).toBe("unknown_dependency");
    expect(unknown.message).toContain('"ghost"');
    const cycle = refusal(() =>
      parseWorkflowDefinition(def([node("a", ["c"]), node("b", ["a"]), node("c", ["b"])]), "json"),
    );
    expect(cycle.code).toBe("dependency_cycle");
    expect(cycle.context.cycle).toEqual(["a", "c", "b", "a"]);
    expect(refusal(() => parseWorkflowDefinition(def([node("a", ["a"])]), "json")).code).toBe(
      "dependency_cycle",
    );
    expect(
      refusal(() =>
        parseWorkflowDefinition(
          JSON.stringify({ name: "x", nodes: [{ id: "a", task: "t", shell: "rm" }] }),
          "json",
        ),
      ).code,
    ).toBe("definition_invalid");
    expect(refusal(() => parseWorkflowDefinition("name: [unclosed")).code).toBe("definition_syntax");
  });

  it("refuses huge definitions by bytes and by node count before looking at the graph", () => {
    const big = `name: big\nnodes:\n  - id: a\n    task: "${"x".repeat(DEFINITION_LIMITS.bytes)}"\n`;
    expect(refusal(() => parseWorkflowDefinition(big)).code).toBe("definition_too_large");
    const many = {
      name: "many",
      nodes: Array.from({ length: DEFINITION_LIMITS.nodes + 1 }, (_, i) => ({ id: `n${i}`, task: "t" })),
    };
    expect(refusal(() => parseWorkflowDefinition(JSON.stringify(many), "json")).code).toBe("too_many_nodes");
  });

  it("finds a cycle in a long chain without recursion", () => {
    const n = 400;
    const nodes = Array.from({ length: n }, (_, i) => ({
      id: `n${i}`,
      task: "t",
      dependsOn: [`n${(i + 1) % n}`],
    }));
    expect(refusal(() => parseWorkflowDefinition(JSON.stringify({ name: "ring", nodes }), "json")).code).toBe(
      "dependency_cycle",
    );
  });

  it("validates added nodes against the existing graph", () => {
    const existing = parseWorkflowDefinition(yaml).nodes;
    expect(
      validateAddedNodes(existing, [{ id: "fix", task: "t", dependsOn: ["review"] }], 500).map((n) => n.id),
    ).toEqual(["fix"]);
    expect(refusal(() => validateAddedNodes(existing, [{ id: "survey", task: "t" }], 500)).code).toBe(
      "duplicate_node",
    );
    expect(
      refusal(() => validateAddedNodes(existing, [{ id: "x", task: "t", dependsOn: ["nope"] }], 500)).code,
    ).toBe("unknown_dependency");
    expect(refusal(() => validateAddedNodes(existing, [{ id: "x", task: "t" }], 2)).code).toBe(
      "too_many_nodes",
    );
  });
});

describe("the bounded, version-pinned project-file reader", () => {
  it("reads inside the project and names the exact version it read", async () => {
    const root = scratchDir("crw-wf-");
    await writeFile(join(root, "wf.yaml"), yaml);
    const reader = boundedProjectFileReader({ root });
    const file = await reader.readProjectFile("wf.yaml");
    expect(file.text).toBe(yaml);
    expect(file.version).toBe(createHash("sha256").update(yaml).digest("hex"));
    await expect(reader.readProjectFile("wf.yaml", { expectedVersion: file.version })).resolves.toMatchObject(
      { version: file.version },
    );
    await writeFile(join(root, "wf.yaml"), `${yaml}\n# edited\n`);
    await expect(reader.readProjectFile("wf.yaml", { expectedVersion: file.version })).rejects.toMatchObject({
      code: "definition_changed",
    });
  });

  it("refuses a file outside the project (also through a symbolic link), a missing file and an oversized one", async () => {
    const root = scratchDir("crw-wf-");
    const outside = scratchDir("crw-out-");
    await writeFile(join(outside, "secret.yaml"), "name: s\nnodes: [{id: a, task: t}]\n");
    await symlink(join(outside, "secret.yaml"), join(root, "link.yaml"));
    await writeFile(join(root, "big.yaml"), "x".repeat(2048));
    const reader = boundedProjectFileReader({ root, maxBytes: 1024 });
    await expect(reader.readProjectFile(join(outside, "secret.yaml"))).rejects.toMatchObject({
      code: "definition_unreadable",
    });
    await expect(reader.readProjectFile("link.yaml")).rejects.toMatchObject({
      code: "definition_unreadable",
    });
    await expect(reader.readProjectFile("nope.yaml")).rejects.toMatchObject({
      code: "definition_unreadable",
    });
    await expect(reader.readProjectFile("big.yaml")).rejects.toMatchObject({ code: "definition_too_large" });
  });

  it("a refused definition changes nothing: no workflow row, no journal, no child", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(() => "never");
    const root = scratchDir("crw-wf-");
    await writeFile(
      join(root, "cycle.json"),
      JSON.stringify({
        name: "c",
        nodes: [
          { id: "a", task: "t", dependsOn: ["b"] },
          { id: "b", task: "t", dependsOn: ["a"] },
        ],
      }),
    );
    const before = await db.pool.query(
      "select (select count(*) from workflows) w, (select count(*) from sessions) s",
    );
    await expect(
      engine.start(w.ctx(), { path: "cycle.json", reader: boundedProjectFileReader({ root }) }),
    ).rejects.toMatchObject({
      name: "WorkflowDefinitionError",
      code: "dependency_cycle",
    });
    const after = await db.pool.query(
      "select (select count(*) from workflows) w, (select count(*) from sessions) s",
    );
    expect(after.rows).toEqual(before.rows);
    await engine.close();
  });
});
