import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type DelegationEvent, parseDelegatedExecutionScope } from "../../src/index.js";
import {
  answeredChild,
  delegateBackground,
  emitSummary,
  gatedHelperTask,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  settledHelperResult,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/**
 * A background call whose child answered "C waits" and settles on a live helper (held at its gate) gets a
 * workflow summary: the summary's result turn starts on its own and answers, or fails at the provider.
 * Returns the service's background failures once the helper settled and the call with it.
 */
async function summaryTurnWhileSettling(summaryTurn: "answers" | "fails") {
  const gates = new Map<string, Promise<void>>();
  const helper = latch();
  gates.set("helper", helper.promise);
  const events: DelegationEvent[] = [];
  const { service, repo } = makeService(db.pool, {
    tools: () => [gateTool("Gate", gates)],
    onEvent: (e) => events.push(e),
  });
  const { account, parent } = await newParent(service);
  const failures = () => events.filter((e) => e.type === "delegation.background_failed");
  const receipt = await delegateBackground(
    service,
    { parent, account },
    "c",
    // requests 0 and 1 are the call's own turn; request 2 is the summary's result turn
    gatedHelperTask("helper", "helper done", {
      answer: "C waits",
      followUp: "C took",
      ...(summaryTurn === "fails" ? { failAtRequest: 2 } : {}),
    }),
  );
  if (receipt.kind !== "started") throw new Error("expected a background call");
  const childId = receipt.childSessionId;
  const replies = async () =>
    messages(await repo.readJournal(childId, account.id)).flatMap((m) =>
      m.role === "assistant" ? m.content.flatMap((c) => (c.type === "text" ? [c.text] : [])) : [],
    );
  await waitFor(
    async () => (await replies()).includes("C waits") && !service.turns.isBusy(childId),
    "the call settling on its live helper",
  );
  await emitSummary(service, childId, account.id);
  await waitFor(
    async () => (summaryTurn === "fails" ? failures().length > 0 : (await replies()).includes("C took (1)")),
    "the summary's result turn to end",
  );
  helper.open();
  await waitFor(
    async () => (await repo.getRun(receipt.runId, account.id)).settledAt !== null,
    "the call to settle",
  );
  await service.whenIdle();
  return failures();
}

describe("a result turn a workflow summary starts on its own", () => {
  it("that answers reports no failure", async () => {
    expect(await summaryTurnWhileSettling("answers")).toEqual([]);
  });

  it("that fails is reported as a background failure with the turn's error", async () => {
    const failures = await summaryTurnWhileSettling("fails");
    expect(failures).toHaveLength(1);
    expect(failures[0]).toMatchObject({ error: "scripted provider failure" });
  });

  it("for a child whose call has settled waits in the child's inbox: no turn of the child runs for it", async () => {
    const { service, repo } = makeService(db.pool);
    const caller = await newParent(service);
    const childId = await answeredChild(service, caller, "c", "done");
    await service.whenIdle();
    await emitSummary(service, childId, caller.account.id);
    await service.whenIdle();
    expect(await repo.queuedResultIds(childId, caller.account.id)).toHaveLength(1);
    const journal = messages(await repo.readJournal(childId, caller.account.id));
    expect(journal.map((m) => m.role)).toEqual(["user", "assistant"]);
    await service.close();
  });
});

/** A child that answered "first", with a helper's result waiting in its inbox. */
async function childWithHelperResult() {
  const made = makeService(db.pool);
  const { account, parent } = await newParent(made.service);
  const child = await made.repo.getSession(
    await answeredChild(made.service, { parent, account }, "c", "first"),
    account.id,
  );
  const resultId = await settledHelperResult(made.repo, child, account.id, "h", "helper says");
  const drain = (signal?: AbortSignal) =>
    made.service.drainPendingResults(
      child,
      parseDelegatedExecutionScope(child.scope ?? ""),
      () => {},
      signal,
    );
  const roles = async () => messages(await made.repo.readJournal(child.id, account.id)).map((m) => m.role);
  return { ...made, resultId, drain, roles };
}

describe("a drain of a settling child", () => {
  it("asked for twice at once is one drain: one turn, and both callers get its outcome", async () => {
    const { service, resultId, drain, roles } = await childWithHelperResult();
    const [a, b] = await Promise.all([drain(), drain()]);
    expect(a).toEqual({ kind: "delivered", resultIds: [resultId], reply: "noted (1)" });
    expect(b).toEqual(a);
    expect(await roles()).toEqual(["user", "assistant", "custom", "assistant"]);
    await service.close();
  });

  it("whose delivery the restart checkpoint refuses fails with that refusal", async () => {
    const { service, drain, roles } = await childWithHelperResult();
    const pausing = service.pauseForRestart();
    const out = await drain();
    await pausing;
    expect(out).toMatchObject({
      kind: "failed",
      resultId: undefined,
      reason: "a delivery refused: this process is pausing for a restart; boot recovery continues its work",
    });
    expect(await roles()).toEqual(["user", "assistant"]);
  });

  it("whose delivery is refused after its caller stopped it ends stopped, not failed", async () => {
    const { service, drain } = await childWithHelperResult();
    const stop = new AbortController();
    stop.abort();
    const pausing = service.pauseForRestart();
    expect(await drain(stop.signal)).toEqual({ kind: "aborted" });
    await pausing;
  });
});
