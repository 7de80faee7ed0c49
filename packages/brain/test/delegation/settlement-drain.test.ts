import type { DelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  type DelegationService,
  type SessionTurnRunner,
  type TurnOutcome,
} from "../../src/index.js";
import {
  type Caller,
  delegateBackground,
  delegateCall,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/**
 * `promise`, or a failure naming the state that never came within `ms`: a wait on a latch or on the service
 * fails where it hangs instead of at the test's timeout.
 */
function within<T>(promise: Promise<T>, what: string, ms = 20_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * The scripted runner, with `hook.beforeTurn(sessionId, n)` awaited before the n-th turn (1-based) of each
 * session runs: after the bracket journaled what was pending, before the model sees it. An outcome it
 * answers is the turn's, without the model.
 */
function beforeEachTurn(hook: {
  beforeTurn?: (sessionId: string, n: number) => Promise<TurnOutcome | undefined>;
}) {
  const scripted = createScriptedTurnRunner();
  const counts = new Map<string, number>();
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      const n = (counts.get(request.sessionId) ?? 0) + 1;
      counts.set(request.sessionId, n);
      const instead = await hook.beforeTurn?.(request.sessionId, n);
      return instead ?? scripted.runTurn(request, host);
    },
  };
  return runner;
}

async function steerRows(childSessionId: string) {
  const { rows } = await db.pool.query<{ text: string; status: string; drop_reason: string | null }>(
    "select text, status, drop_reason from delegated_steers where child_session_id = $1 order by created_at",
    [childSessionId],
  );
  return rows;
}

/** The call's run once it settled (and the service went idle), with the one result its parent got. */
async function settledCall(service: DelegationService, runId: string, caller: Caller) {
  const { repo } = service;
  await waitFor(
    async () => (await repo.getRun(runId, caller.account.id)).settledAt !== null,
    "the call to settle",
  );
  await within(service.whenIdle(), "the service going idle after the call settled");
  const run = await repo.getRun(runId, caller.account.id);
  const [resultId] = await repo.settledResultIds(caller.parent.id, caller.account.id);
  return { run, result: await repo.getResult(resultId ?? "", caller.account.id) };
}

/**
 * A background call whose child gets a text follow-up during each of its first `steered` turns (each one
 * then needs one more follow-up turn), with the given service options. Returns the settled run and result.
 */
async function steeredCall(
  steered: number,
  options: { maxDrainTurns?: number; failAtRequest?: number } = {},
) {
  const hook: Parameters<typeof beforeEachTurn>[0] = {};
  const { service, repo } = makeService(db.pool, {
    runner: beforeEachTurn(hook),
    ...(options.maxDrainTurns !== undefined ? { maxDrainTurns: options.maxDrainTurns } : {}),
  });
  const { account, parent } = await newParent(service);
  hook.beforeTurn = async (sessionId, n) => {
    if (sessionId !== parent.id && n <= steered) await repo.enqueueSteer(sessionId, account.id, `steer ${n}`);
  };
  const receipt = await delegateBackground(
    service,
    { parent, account },
    "c",
    scriptTask({
      answer: "C done",
      followUp: "C took",
      ...(options.failAtRequest !== undefined ? { failAtRequest: options.failAtRequest } : {}),
    }),
  );
  if (receipt.kind !== "started") throw new Error("expected a background call");
  const { run, result } = await settledCall(service, receipt.runId, { parent, account });
  const replies = messages(await repo.readJournal(receipt.childSessionId, account.id)).flatMap((m) =>
    m.role === "assistant" ? m.content.flatMap((c) => (c.type === "text" ? [c.text] : [])) : [],
  );
  return { run, result, replies, steers: await steerRows(receipt.childSessionId) };
}

describe("the settlement drain's bound", () => {
  it("the last follow-up turn the bound allows may take the last pending work: the call settles ok", async () => {
    const { run, result, replies, steers } = await steeredCall(1, { maxDrainTurns: 1 });
    expect(run.status).toBe("succeeded");
    expect(result).toMatchObject({ outcome: "ok", body: "C took (1)" });
    expect(replies).toEqual(["C done", "C took (1)"]);
    expect(steers).toEqual([{ text: "steer 1", status: "delivered", drop_reason: null }]);
  });

  it("more follow-up turns than the bound fail the call, and the follow-up left over is dropped", async () => {
    const { run, result, replies, steers } = await steeredCall(2, { maxDrainTurns: 1 });
    expect(run.status).toBe("failed");
    expect(run.error).toEqual({
      code: "child_failed",
      message: "more than 1 follow-up turns while settling",
    });
    expect(result).toMatchObject({ outcome: "error", body: "more than 1 follow-up turns while settling" });
    expect(replies).toEqual(["C done", "C took (1)"]);
    expect(steers).toEqual([
      { text: "steer 1", status: "delivered", drop_reason: null },
      {
        text: "steer 2",
        status: "dropped",
        drop_reason: "the call ended: more than 1 follow-up turns while settling",
      },
    ]);
  });

  it("without a bound given, several follow-up turns in a row all run", async () => {
    const { run, result, replies } = await steeredCall(3);
    expect(run.status).toBe("succeeded");
    expect(result.body).toBe("C took (3)");
    expect(replies).toEqual(["C done", "C took (1)", "C took (2)", "C took (3)"]);
  });
});

describe("a failed follow-up turn", () => {
  it("ends the settlement at once: no further turn takes what arrived meanwhile, which is dropped", async () => {
    // request 0 answers "C done"; request 1, the first follow-up turn, fails at the provider
    const { run, result, replies, steers } = await steeredCall(2, { failAtRequest: 1 });
    expect(run.status).toBe("failed");
    expect(run.error).toEqual({ code: "child_failed", message: "scripted provider failure" });
    expect(result).toMatchObject({ outcome: "error", body: "scripted provider failure" });
    expect(replies).toEqual(["C done"]);
    expect(steers).toEqual([
      { text: "steer 1", status: "delivered", drop_reason: null },
      { text: "steer 2", status: "dropped", drop_reason: "the call ended: scripted provider failure" },
    ]);
  });
});

describe("a repository without the one-snapshot read of a child's work", () => {
  it("the call still waits out its live helper and takes its result before settling", async () => {
    const gates = new Map<string, Promise<void>>();
    const made = makeService(db.pool);
    // the same repository, without its optional settlementWork: the three separate reads are used
    const { settlementWork: _, ...separate } = made.repo;
    const bare: DelegationRepository = separate;
    const { service, repo } = makeService(db.pool, { repo: bare, tools: () => [gateTool("Gate", gates)] });
    const { account, parent } = await newParent(service);
    const helper = latch();
    gates.set("helper", helper.promise);
    const receipt = await delegateBackground(
      service,
      { parent, account },
      "c",
      scriptTask({
        rounds: [
          [
            delegateCall(
              { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
              { background: true },
            ),
          ],
        ],
        answer: "C done",
        followUp: "C folded in",
      }),
    );
    if (receipt.kind !== "started") throw new Error("expected a background call");
    await waitFor(async () => {
      const msgs = messages(await repo.readJournal(receipt.childSessionId, account.id));
      return msgs.some(
        (m) => m.role === "assistant" && m.content.some((c) => c.type === "text" && c.text === "C done"),
      );
    }, "the child's first answer");
    await new Promise((r) => setTimeout(r, 300));
    expect((await repo.getRun(receipt.runId, account.id)).settledAt).toBeNull();
    await repo.enqueueSteer(receipt.childSessionId, account.id, "also this");
    helper.open();
    await waitFor(
      async () => (await repo.settledResultIds(parent.id, account.id)).length === 1,
      "the call's result",
    );
    await within(service.whenIdle(), "the service going idle after the call's result");
    const [resultId] = await repo.settledResultIds(parent.id, account.id);
    expect((await repo.getResult(resultId ?? "", account.id)).body).toBe("C folded in (2)");
  });
});

/**
 * A background call whose child answered "C waits" and now settles on a live helper (held by `helperGate`);
 * the child's second turn (a workflow summary's result turn) is held before its model runs until
 * `summaryRelease` opens (`summaryHeld` says it got there); it then answers, fails at the provider, or ends
 * stopped (as a runner may report, not by the call's signal). `noHelperLeft` opens when a look of the
 * settlement's drain finds no live helper of the child: the next thing the drain does is look for a running
 * result turn (no await in between).
 */
async function callSettlingOnHelper(summaryTurn: "answers" | "fails" | "stops") {
  const gates = new Map<string, Promise<void>>();
  const helperGate = latch();
  gates.set("helper", helperGate.promise);
  const summaryHeld = latch();
  const summaryRelease = latch();
  const hook: Parameters<typeof beforeEachTurn>[0] = {};
  const { service, repo } = makeService(db.pool, {
    runner: beforeEachTurn(hook),
    tools: () => [gateTool("Gate", gates)],
  });
  // Every look of the drain is seen, the call's first included: a look the drain sent while the child still
  // had its helper may take its snapshot only after the helper settled (a loaded host), and it is then the
  // one that finds no helper left.
  const noHelperLeft = latch();
  let childId = "";
  const look = repo.markSettlingWithReply.bind(repo);
  repo.markSettlingWithReply = async (runId, generation, sessionId, principal, options) => {
    const out = await look(runId, generation, sessionId, principal, options);
    if (sessionId === childId && out.work?.openChildRuns === 0) noHelperLeft.open();
    return out;
  };
  const { account, parent } = await newParent(service);
  const receipt = await delegateBackground(
    service,
    { parent, account },
    "c",
    scriptTask({
      rounds: [
        [
          delegateCall(
            { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
            { background: true },
          ),
        ],
      ],
      answer: "C waits",
      followUp: "C took",
      // requests 0 and 1 are the call's own turn; request 2 is the summary's result turn
      ...(summaryTurn === "fails" ? { failAtRequest: 2 } : {}),
    }),
  );
  if (receipt.kind !== "started") throw new Error("expected a background call");
  childId = receipt.childSessionId;
  hook.beforeTurn = async (sessionId, n) => {
    if (sessionId !== childId || n !== 2) return;
    summaryHeld.open();
    await summaryRelease.promise;
    return summaryTurn === "stops" ? { stopReason: "aborted" } : undefined;
  };
  await waitFor(async () => {
    const answered = messages(await repo.readJournal(childId, account.id)).some(
      (m) => m.role === "assistant" && m.content.some((c) => c.type === "text" && c.text === "C waits"),
    );
    return answered && !service.turns.isBusy(childId);
  }, "the call settling on its live helper");
  const summary = () =>
    service.emitDelegationCompletion({
      kind: "workflow_summary",
      parentSessionId: childId,
      principalAccountId: account.id,
      toolCallId: "wf",
      outcome: "ok",
      summary: "the workflow finished",
    });
  const settled = () => settledCall(service, receipt.runId, { parent, account });
  return { repo, account, childId, helperGate, summaryHeld, summaryRelease, noHelperLeft, summary, settled };
}

/**
 * A call settling on a live helper gets a workflow summary: its result turn starts on its own and is held
 * (before its model runs) until the helper has settled too, so the settlement finds that turn running.
 */
async function summaryWhileSettling(summaryTurn: "answers" | "fails" | "stops") {
  const call = await callSettlingOnHelper(summaryTurn);
  await call.summary();
  await within(call.summaryHeld.promise, "the summary's result turn reaching its model");
  call.helperGate.open();
  // the settlement wakes on the helper's result and finds the summary's turn still running
  await within(call.noHelperLeft.promise, "a look of the settlement finding no live helper");
  await new Promise((r) => setImmediate(r));
  call.summaryRelease.open();
  return call.settled();
}

/**
 * As above, but the summary's result turn takes the helper's result too: the settlement's look, held until
 * that turn runs, finds nothing open and nothing waiting while the turn still runs.
 */
async function summaryTakingEverything() {
  const call = await callSettlingOnHelper("answers");
  const lookHeld = latch();
  const lookRelease = latch();
  const lookDone = latch();
  let hold = false;
  const look = call.repo.markSettlingWithReply.bind(call.repo);
  call.repo.markSettlingWithReply = async (runId, generation, sessionId, principal, options) => {
    if (sessionId !== call.childId || !hold) return look(runId, generation, sessionId, principal, options);
    hold = false;
    lookHeld.open();
    await lookRelease.promise;
    const out = await look(runId, generation, sessionId, principal, options);
    lookDone.open();
    return out;
  };
  hold = true;
  await within(lookHeld.promise, "the settlement's next look");
  call.helperGate.open();
  await waitFor(
    async () => (await call.repo.queuedResultIds(call.childId, call.account.id)).length === 1,
    "the helper's result",
  );
  await call.summary();
  await within(call.summaryHeld.promise, "the summary's result turn reaching its model");
  lookRelease.open();
  await within(lookDone.promise, "the held look's answer");
  await new Promise((r) => setImmediate(r));
  call.summaryRelease.open();
  return call.settled();
}

describe("a result turn the settlement finds running", () => {
  it("is waited for, and the helper result that came meanwhile gets its own turn before the call settles", async () => {
    const { run, result } = await summaryWhileSettling("answers");
    expect(run.status).toBe("succeeded");
    // the summary's turn answered "(1)"; the next turn took the helper's result as well: "(2)"
    expect(result.body).toBe("C took (2)");
  });

  it("that fails ends the call with its failure; the helper result is not taken", async () => {
    const { run, result } = await summaryWhileSettling("fails");
    expect(run.status).toBe("failed");
    expect(result).toMatchObject({ outcome: "error", body: "scripted provider failure" });
  });

  it("that took everything pending is still waited for: the call settles with that turn's answer", async () => {
    const { run, result } = await summaryTakingEverything();
    expect(run.status).toBe("succeeded");
    // the summary's turn took the summary and the helper's result: "(2)", not the first answer "C waits"
    expect(result.body).toBe("C took (2)");
  });

  it("that ends stopped ends the call as stopped; the helper result that came meanwhile gets no turn", async () => {
    const { run, result } = await summaryWhileSettling("stops");
    expect(run.status).toBe("failed");
    expect(run.error).toEqual({ code: "aborted", message: "the call was stopped" });
    expect(result).toMatchObject({ outcome: "error", body: "the call was stopped" });
  });
});
