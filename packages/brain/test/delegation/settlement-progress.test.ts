import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import type { ProgressEvent } from "../../src/index.js";
import { delegateCall, makeService, newParent, scriptTask } from "./helpers.js";

const db = useTestDatabase();

describe("the progress a call's caller sees", () => {
  it("carries the child's activity, but not the identity event of a call the child makes itself", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const events: ProgressEvent[] = [];
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fg",
      task: scriptTask({ rounds: [[delegateCall({ answer: "grandchild done" })]], answer: "child done" }),
      mode: "foreground",
      progress: (e) => events.push(e),
    });
    if (receipt.kind !== "result") throw new Error("expected a result");
    expect(receipt.body).toBe("child done");
    const sessions = events.filter((e) => e.type === "session");
    // only the call's own child: its grandchild is the child's business
    expect(sessions).toEqual([
      { type: "session", sessionId: receipt.childSessionId, parentSessionId: parent.id },
    ]);
    expect(events.some((e) => e.type === "tool" && e.sessionId === receipt.childSessionId)).toBe(true);
    await service.close();
  });
});
