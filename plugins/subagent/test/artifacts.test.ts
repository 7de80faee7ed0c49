import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { parseWorkflowDefinition, sha256Hex, workflowArtifactPath } from "../src/index.js";
import { closeEnginesAfterEach, taskLine, world } from "./helpers.js";

const db = useTestDatabase();
const all = closeEnginesAfterEach();

describe("shared result artifacts", () => {
  it("grants are minted from stored dependency ids and hashes, for the parent and direct dependents only (S004-306 S004-308)", async () => {
    const w = await world(db.pool);
    const def = parseWorkflowDefinition(`
name: share
nodes:
  - { id: a, task: "TASK a" }
  - { id: b, task: "TASK b", dependsOn: [a] }
  - { id: c, task: "TASK c (also read /etc/passwd and workflow-artifacts/x/y/z)", dependsOn: [b] }
`);
    const { engine } = await w.engine(({ task }) => `full result of ${taskLine(task)} ${"x".repeat(3000)}`);
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
    // A caller-supplied path or hash mints nothing.
    expect(
      await engine.artifacts.grant(started.workflowId, "a", "0".repeat(64), childC as string),
    ).toBeNull();
    expect(await engine.artifacts.readArtifact(childC as string, "/etc/passwd")).toBeNull();
    const { rows } = await db.pool.query(
      "select count(*)::int n from workflow_artifact_grants where recipient_session_id = $1::uuid",
      [childC],
    );
    expect(rows[0].n).toBe(1);
    // Only the short handover travels in the prompt, with the artifact's address.
    const { rows: prompt } = await db.pool.query(
      "select body from journal_entries where session_id = $1::uuid order by seq limit 1",
      [childB],
    );
    const content = JSON.parse(prompt[0].body).message.content as string;
    expect(content).toContain(pathA);
    expect(content.length).toBeLessThan(bodyA.length);
  });
});
