import { randomUUID } from "node:crypto";
import {
  createScriptedTurnRunner,
  DelegationService,
  FileSpillStore,
  type MutatingTool,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
  scriptTask,
  type ToolContext,
} from "@crw/brain";
import { PgDelegationRepository, type SessionRow } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { describe, expect, it } from "vitest";
import { delegationNodeTurns, JournalNodeDispatcher, subagentTools, WorkflowEngine } from "../src/index.js";

const db = useTestDatabase();

async function setup() {
  const repo = new PgDelegationRepository(db.pool);
  const turns: { sessionId: string; model: string; readOnly: boolean }[] = [];
  const scripted = createScriptedTurnRunner();
  const runner: SessionTurnRunner = {
    runTurn(request, host) {
      turns.push({ sessionId: request.sessionId, model: request.model, readOnly: request.readOnly });
      return scripted.runTurn(request, host);
    },
  };
  const service = new DelegationService({
    repo,
    runner,
    spill: new FileSpillStore(scratchDir("crw-spill-")),
  });
  const engine = new WorkflowEngine({
    pool: db.pool,
    owner: `wf-${randomUUID()}`,
    dispatcher: new JournalNodeDispatcher(repo, delegationNodeTurns(service)),
    defaultModel: "scripted",
    repo,
    onCompletion: (c) => service.resultQueued(c.parentSessionId, c.principalAccountId, c.resultId),
  });
  const account = await repo.createAccount({ name: `a-${randomUUID()}`, isOwner: true });
  const parent = await repo.createRootSession(account.id, "scripted");
  // The plugin's tools of the parent's turn, as the host gives them to the session.
  const tool = (session: SessionRow, readOnly: boolean, name: string): MutatingTool => {
    const found = subagentTools({
      service,
      engine,
      session,
      readOnly,
      reader: null,
      currentWorkDir: async () => null,
    }).find((t) => t.name === name);
    if (!found) throw new Error(`no ${name}`);
    return found;
  };
  const ctx = (
    toolCallId: string,
    readOnly = false,
    progress: ToolContext["progress"] = () => {},
  ): ToolContext => ({
    sessionId: parent.id,
    principalAccountId: account.id,
    toolCallId,
    readOnly,
    workDir: null,
    signal: new AbortController().signal,
    progress,
  });
  return { repo, service, account, parent, tool, ctx, turns };
}

describe("the plugin's DelegateContinue passes model and promote through to the delegation core", () => {
  it("the call id, onEvent, model and promote reach the delegation core: model runs this continuation on another model (stored on its call), promote re-mints the child's scope; both refused or absent where they must be (S004-215)", async () => {
    const { repo, service, account, parent, tool, ctx, turns } = await setup();
    const first = await tool(parent, false, "Delegate").execute(
      { task: scriptTask({ answer: "first" }), readOnly: true },
      ctx("d1"),
    );
    const child = first.details?.childSessionId;
    if (!child) throw new Error("the Delegate call returned no child");
    expect(
      parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "").readOnly,
    ).toBe(true);

    // model: the call's row keeps it, the turn runs on it, the child session keeps its own model; the
    // tool call's onEvent hears the call's session and its activity.
    const heard: Parameters<ToolContext["progress"]>[0][] = [];
    const other = await tool(parent, false, "DelegateContinue").execute(
      { sessionId: child, text: scriptTask({ answer: "on the other model" }), model: "scripted:other" },
      ctx("c-model", false, (e) => heard.push(e)),
    );
    expect(heard[0]).toMatchObject({ type: "session", sessionId: child, parentSessionId: parent.id });
    expect(heard).toContainEqual(expect.objectContaining({ type: "text", text: "on the other model" }));
    expect(other.content).toContain("on the other model");
    expect((await repo.runForToolCall(parent.id, "c-model", account.id))?.model).toBe("scripted:other");
    expect((await repo.getSession(child, account.id)).model).toBe("scripted");
    expect(turns.filter((t) => t.sessionId === child).map((t) => t.model)).toEqual([
      "scripted",
      "scripted:other",
    ]);

    // promote from a read-only turn of the parent: refused, nothing written.
    await expect(
      tool(parent, true, "DelegateContinue").execute(
        { sessionId: child, text: "go", promote: true },
        ctx("p-ro", true),
      ),
    ).rejects.toMatchObject({ code: "write_access_refused" });
    expect(await repo.runForToolCall(parent.id, "p-ro", account.id)).toBeNull();

    // promote: the child's durable scope is minted again from the caller's live access (writable now).
    const promoted = await tool(parent, false, "DelegateContinue").execute(
      { sessionId: child, text: scriptTask({ answer: "promoted" }), promote: true },
      ctx("p-1"),
    );
    expect(promoted.content).toContain("promoted");
    expect(
      parseDelegatedExecutionScope((await repo.getSession(child, account.id)).scope ?? "").readOnly,
    ).toBe(false);
    expect(turns.filter((t) => t.sessionId === child).map((t) => t.readOnly)).toEqual([true, true, false]);
    // Without either, the next continuation runs on the child's own model again.
    await tool(parent, false, "DelegateContinue").execute(
      { sessionId: child, text: scriptTask({ answer: "plain" }) },
      ctx("c-plain"),
    );
    expect(turns.filter((t) => t.sessionId === child).at(-1)?.model).toBe("scripted");
    expect((await repo.runForToolCall(parent.id, "c-plain", account.id))?.model ?? null).toBeNull();
    await service.close();
  });

  it("the arguments are typed: a model that is not a non-empty string or a promote that is not a boolean is refused", async () => {
    const { parent, tool, ctx } = await setup();
    const cont = tool(parent, false, "DelegateContinue");
    await expect(
      cont.execute({ sessionId: randomUUID(), text: "x", model: "" }, ctx("bad-1")),
    ).rejects.toMatchObject({ code: "invalid_input" });
    await expect(
      cont.execute({ sessionId: randomUUID(), text: "x", promote: "yes" }, ctx("bad-2")),
    ).rejects.toMatchObject({ code: "invalid_input" });
    const schema = cont.parameters as { properties: Record<string, unknown> };
    expect(Object.keys(schema.properties)).toEqual(
      expect.arrayContaining(["sessionId", "text", "background", "writeAccess", "model", "promote"]),
    );
  });
});
