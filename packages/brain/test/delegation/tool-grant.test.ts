import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import type { MutatingTool } from "../../src/index.js";
import {
  delegateForeground,
  makeService,
  newParent,
  recording,
  scriptTask,
  waitFor,
  writeTool,
} from "./helpers.js";

const db = useTestDatabase();

const hostTool = (name: string, subject?: MutatingTool["subject"]): MutatingTool => ({
  name,
  description: name,
  parameters: {},
  ...(subject ? { subject } : {}),
  async execute() {
    return { content: "ran" };
  },
});

const HOST_TOOLS: MutatingTool[] = [
  hostTool("WorkflowStart"),
  hostTool("mcp__srv__query"),
  // No subject: an argument pattern's denial refuses every call of it.
  hostTool("Gated"),
  // A subject: an argument pattern's denial refuses only some calls of it.
  hostTool("Runner", (args) => (typeof args.command === "string" ? args.command : undefined)),
  writeTool,
];

describe("the account's tool grant and the offered tool list", () => {
  it("a tool the turn's scope denies by name is not offered to a root or a child turn", async () => {
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { runner, tools: () => HOST_TOOLS });
    const { account, parent } = await newParent(service, {
      toolDeny: ["WorkflowStart", "mcp__srv__*", "Delegate", "Gated(x*)", "Runner(rm *)"],
    });
    await service.prompt(parent.id, account.id, scriptTask({ answer: "root" }));
    const child = await delegateForeground(
      service,
      { parent, account },
      "d",
      scriptTask({ answer: "child" }),
    );
    if (child.kind !== "result") throw new Error("expected a result");
    const namesOf = (sessionId: string) =>
      seen.filter((r) => r.sessionId === sessionId).map((r) => r.tools.map((t) => t.name));
    // The prompt's turn, then the idle parent's follow-up answering the delegated result (a foreground call
    // made outside a turn of the parent reaches it through its inbox): it may come before or after the call
    // returns, so it is waited for.
    await waitFor(async () => namesOf(parent.id).length === 2, "the parent's follow-up turn");
    const root = namesOf(parent.id);
    const delegated = namesOf(child.childSessionId);
    expect(root).toHaveLength(2);
    expect(delegated).toHaveLength(1);
    for (const names of [...root, ...delegated]) {
      expect(names).toEqual(expect.arrayContaining(["Runner", "Write"]));
      for (const denied of ["WorkflowStart", "mcp__srv__query", "Delegate", "Gated"])
        expect(names).not.toContain(denied);
    }
    await service.close();
  });

  it("an allow-list offers only the tools it names", async () => {
    const { seen, runner } = recording();
    const { service } = makeService(db.pool, { runner, tools: () => HOST_TOOLS });
    const { account, parent } = await newParent(service, { toolAllow: ["Write", "Runner(git *)", "mcp__*"] });
    await service.prompt(parent.id, account.id, scriptTask({ answer: "root" }));
    const names = seen.filter((r) => r.sessionId === parent.id).flatMap((r) => r.tools.map((t) => t.name));
    expect([...names].sort()).toEqual(["Runner", "Write", "mcp__srv__query"]);
    await service.close();
  });

  it("authorityFor narrows by the account's permission boundary, as currentDelegatedAccess does", async () => {
    const { service } = makeService(db.pool);
    const { account, parent } = await newParent(service, {
      permissionSettings: { permissionBoundary: "read-only" },
    });
    expect((await service.authorityFor(parent)).permissionBoundary).toBe("read-only");
    const child = await delegateForeground(service, { parent, account }, "d", scriptTask({ answer: "ok" }));
    if (child.kind !== "result") throw new Error("expected a result");
    const childRow = await service.repo.getSession(child.childSessionId, account.id);
    const scope = JSON.parse(childRow.scope ?? "null");
    expect(scope.permissionBoundary).toBe("read-only");
    expect(scope.readOnly).toBe(true);
    // The child's own authority (its stored scope) keeps the narrower of the two.
    expect((await service.authorityFor(childRow)).permissionBoundary).toBe("read-only");
    // No boundary setting: nothing narrows (the stored scope's default boundary stands).
    const { account: open, parent: openParent } = await newParent(service);
    const openChild = await delegateForeground(
      service,
      { parent: openParent, account: open },
      "d",
      scriptTask({ answer: "ok" }),
    );
    if (openChild.kind !== "result") throw new Error("expected a result");
    const openRow = await service.repo.getSession(openChild.childSessionId, open.id);
    expect(JSON.parse(openRow.scope ?? "null").permissionBoundary).toBe("workspace-write");
    await service.close();
  });
});
