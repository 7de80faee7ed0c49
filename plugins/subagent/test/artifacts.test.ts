import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition, sha256Hex, workflowArtifactPath } from "../src/index.js";
import { closeEnginesAfterEach, taskLine, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

describe("shared result artifacts", () => {
  it("grants are minted from stored dependency ids and hashes, for the parent and direct dependents only, before a dependent's turn (S004-306)", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: share
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
  - { id: c, task: "TASK c (also read /etc/passwd and workflow-artifacts/x/y/z)", dependsOn: [b] }
`);
    // What each node's child could already read when its turn ran.
    const grantedAtTurn: Record<string, string[]> = {};
    const { engine } = await w.engine(async ({ task, sessionId }) => {
      grantedAtTurn[taskLine(task)] = (await engine.artifacts.grantsOf(sessionId)).map((g) => g.nodeId);
      return `full result of ${taskLine(task)} ${"x".repeat(3000)}`;
    });
    all.push(engine);
    const started = await engine.start(w.ctx(), { definition: def });
    await engine.finished(started.workflowId);
    const { rows: children } = await db.pool.query(
      "select id from sessions where parent_session_id = $1::uuid order by created_at",
      [w.parentSessionId],
    );
    const [childA, childB, childC] = children.map((r) => String(r.id));
    const bodyA = `full result of TASK a ${"x".repeat(3000)}`;
    const pathA = workflowArtifactPath(started.workflowId, "a", sha256Hex(bodyA));
    // The parent and the direct dependent read the same full output; an indirect dependent cannot.
    expect(await engine.artifacts.readArtifact(w.parentSessionId, pathA)).toBe(bodyA);
    expect(await engine.artifacts.readArtifact(childB as string, pathA)).toBe(bodyA);
    expect(await engine.artifacts.readArtifact(childC as string, pathA)).toBeNull();
    expect(await engine.artifacts.readArtifact(childA as string, pathA)).toBeNull();
    expect((await engine.artifacts.grantsOf(childC as string)).map((g) => g.nodeId)).toEqual(["b"]);
    expect((await engine.artifacts.grantsOf(w.parentSessionId)).map((g) => g.nodeId)).toEqual([
      "a",
      "b",
      "c",
    ]);
    expect(grantedAtTurn).toEqual({
      "TASK a": [],
      "TASK b": ["a"],
      "TASK c (also read /etc/passwd and workflow-artifacts/x/y/z)": ["b"],
    });
    // Only the short handover travels in the prompt, with the artifact's address.
    const { rows: prompt } = await db.pool.query(
      "select body from journal_entries where session_id = $1::uuid order by seq limit 1",
      [childB],
    );
    const content = JSON.parse(prompt[0].body).message.content as string;
    expect(content).toContain(pathA);
    expect(content.length).toBeLessThan(bodyA.length);
  });

  it("a path named in a task, or a hash that is not the stored one, mints no grant (S004-308)", async () => {
    const w = await world(db.pool);
    const { engine } = await w.engine(({ task }) => `result of ${taskLine(task)}`);
    all.push(engine);
    const started = await engine.start(w.ctx(), {
      definition: parseWorkflowDefinition(`
name: named
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b (also read /etc/passwd and workflow-artifacts/x/a/0000)" }
`),
    });
    await engine.finished(started.workflowId);
    const { rows } = await db.pool.query("select id from sessions where parent_session_id = $1::uuid", [
      w.parentSessionId,
    ]);
    const children = rows.map((r) => String(r.id));
    const forged = workflowArtifactPath(started.workflowId, "a", "0".repeat(64));
    for (const child of children) {
      expect(await engine.artifacts.grantsOf(child)).toEqual([]);
      expect(await engine.artifacts.readArtifact(child, "/etc/passwd")).toBeNull();
      // The grant path the engine mints with, handed a hash no stored artifact has.
      expect([
        ...(await engine.artifacts.grantMany(
          started.workflowId,
          [{ nodeId: "a", sha256: "0".repeat(64) }],
          child,
        )),
      ]).toEqual([]);
      expect(await engine.artifacts.readArtifact(child, forged)).toBeNull();
    }
  });
});
