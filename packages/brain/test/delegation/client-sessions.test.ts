import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { followUpQueued, openClientSession, takeResults } from "../../src/index.js";
import { delegateBackground, makeService, messages, recording, scriptTask, waitFor } from "./helpers.js";

const db = useTestDatabase();

/**
 * Client-driven root sessions: an outside agent (an MCP client) is the session's model. crw runs no turn
 * of its own for it; its results wait in the inbox until the client takes them, each exactly once.
 */
async function clientCaller(
  service: ReturnType<typeof makeService>["service"],
  name = `client-${randomUUID()}`,
) {
  const account = await service.repo.createAccount({ name: `acct-${randomUUID()}` });
  const { session, created } = await openClientSession(service, account.id, name, "scripted");
  return { account, parent: session, created, name };
}

describe("client-driven sessions", () => {
  it("opening a name again finds the same session; another account's name is its own", async () => {
    const { service } = makeService(db.pool);
    const a = await clientCaller(service, "shared-name");
    expect(a.created).toBe(true);
    const again = await openClientSession(service, a.account.id, "shared-name", "scripted");
    expect(again).toMatchObject({ created: false, session: { id: a.parent.id, driver: "client" } });
    const b = await clientCaller(service, "shared-name");
    expect(b.created).toBe(true);
    expect(b.parent.id).not.toBe(a.parent.id);
    const races = await Promise.all(
      Array.from({ length: 8 }, () => openClientSession(service, a.account.id, "raced", "scripted")),
    );
    expect(new Set(races.map((r) => r.session.id)).size).toBe(1);
    expect(races.filter((r) => r.created)).toHaveLength(1);
  });

  it("a result for a client session starts no turn: it waits until taken, then is in the journal once", async () => {
    const { seen, runner } = recording();
    const { service, repo } = makeService(db.pool, { runner });
    const caller = await clientCaller(service);
    const receipt = await delegateBackground(
      service,
      caller,
      "call-1",
      scriptTask({ answer: "child answer" }),
    );
    expect(receipt.kind).toBe("started");
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 1,
      "queued",
    );
    // boot recovery's follow-up of queued roots leaves it alone too
    await followUpQueued(service, [caller.parent]);
    await service.whenIdle();
    expect(seen.filter((r) => r.sessionId === caller.parent.id)).toEqual([]);
    const taken = await takeResults(service, caller.parent);
    expect(taken.map((t) => t.result.body)).toEqual(["child answer"]);
    expect(await takeResults(service, caller.parent)).toEqual([]);
    const delivered = messages(await repo.readJournal(caller.parent.id, caller.account.id)).filter(
      (m) => m.role === "custom",
    );
    expect(delivered).toHaveLength(1);
    expect(taken[0]?.delivered.journalSeq).toBeGreaterThan(0);
  });

  it("concurrent takes hand each result to exactly one of them", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await clientCaller(service);
    for (let i = 0; i < 6; i++)
      await delegateBackground(service, caller, `call-${i}`, scriptTask({ answer: `answer ${i}` }));
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 6,
      "all queued",
    );
    const takes = await Promise.all(Array.from({ length: 4 }, () => takeResults(service, caller.parent)));
    const bodies = takes.flat().map((t) => t.result.body);
    expect(bodies.sort()).toEqual(Array.from({ length: 6 }, (_, i) => `answer ${i}`).sort());
  });

  it("a take that waits is answered by the next result as it is queued", async () => {
    const { service } = makeService(db.pool);
    const caller = await clientCaller(service);
    const waiting = takeResults(service, caller.parent, { waitMs: 20_000 });
    await new Promise((r) => setTimeout(r, 100));
    await delegateBackground(service, caller, "late", scriptTask({ answer: "late answer" }));
    const taken = await waiting;
    expect(taken.map((t) => t.result.body)).toEqual(["late answer"]);
  });

  it("a take of chosen results takes only those still waiting", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await clientCaller(service);
    await delegateBackground(service, caller, "a", scriptTask({ answer: "A" }));
    await delegateBackground(service, caller, "b", scriptTask({ answer: "B" }));
    await waitFor(
      async () => (await repo.queuedResultIds(caller.parent.id, caller.account.id)).length === 2,
      "queued",
    );
    const [first] = await repo.queuedResults(caller.parent.id, caller.account.id);
    const only = await takeResults(service, caller.parent, { only: [first?.id as string] });
    expect(only.map((t) => t.result.id)).toEqual([first?.id]);
    expect(await takeResults(service, caller.parent, { only: [first?.id as string] })).toEqual([]);
    const other = first?.body === "A" ? "B" : "A";
    expect((await takeResults(service, caller.parent)).map((t) => t.result.body)).toEqual([other]);
    const since = new Date(Date.now() - 60_000);
    const taken = await repo.takenResults(caller.parent.id, caller.account.id, since);
    expect(taken.map((t) => t.body)).toEqual([first?.body, other]);
  });

  it("a client session takes no prompt, and a model session's results are not the client's to take", async () => {
    const { service } = makeService(db.pool);
    const caller = await clientCaller(service);
    await expect(service.prompt(caller.parent.id, caller.account.id, "hello")).rejects.toMatchObject({
      code: "invalid_input",
    });
    const model = await service.createRootSession(caller.account.id, "scripted");
    await expect(takeResults(service, model)).rejects.toMatchObject({ code: "invalid_input" });
  });
});
