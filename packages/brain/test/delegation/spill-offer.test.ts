import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { makeService, newParent, recording, scriptTask } from "./helpers.js";

const db = useTestDatabase();

describe("Read of spilled results offered to a delegated child", () => {
  it("its turn is offered Read when it has a spilled result, and not when nothing can reach it", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    const open = async (toolCallId: string) =>
      repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId,
        task: scriptTask({ answer: `${toolCallId} done` }),
        mode: "background",
        model: "scripted",
        scope: JSON.stringify({ accountId: account.id, target: { kind: "host", ref: null } }),
      });
    const plain = await open("plain");
    const spilled = await open("spilled");
    // a result spilled to the child's own namespace before its turn (its helper's, say)
    await repo.recordSpill({
      sessionId: spilled.child.id,
      principalAccountId: account.id,
      path: `/spill/${randomUUID()}.txt`,
      byteSize: 9000,
      sha256: "ab".repeat(32),
    });
    await service.executeRun(plain.run);
    await service.executeRun(spilled.run);
    const toolsOf = (sessionId: string) =>
      seen.filter((r) => r.sessionId === sessionId).map((r) => r.tools.map((t) => t.name));
    expect(toolsOf(plain.child.id)).toHaveLength(1);
    expect(toolsOf(plain.child.id)[0]).not.toContain("Read");
    expect(toolsOf(spilled.child.id)).toHaveLength(1);
    expect(toolsOf(spilled.child.id)[0]).toContain("Read");
    await service.close();
  });
});
