import type { DelegationRepository } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
  type TurnOutcome,
} from "../../src/index.js";
import {
  answeredChild,
  emitSummary,
  makeService,
  messages,
  newParent,
  queuedCall,
  scriptTask,
  settledHelperResult,
} from "./helpers.js";

const db = useTestDatabase();

/** The refusal a write gets once the restart checkpoint began, named by what it was to write. */
function refused(what: string) {
  return {
    code: "paused_for_restart",
    message: `${what} refused: this process is pausing for a restart; boot recovery continues its work`,
  };
}

/**
 * A queued call run until the restart checkpoint refuses one of its writes. The checkpoint begins (without
 * being waited for: it waits for the write in flight) before the call (`pauseFirst`), right after one of the
 * repository's writes (`pauseAfter`), or as the child's turn ends (`afterChildTurn`, which may also replace
 * the turn's outcome). Returns the refusal and the run and child journal as the checkpoint left them.
 */
async function interruptedCall(setup: {
  pauseFirst?: boolean;
  pauseAfter?: "startRun" | "markRunSettling" | "markSettlingWithReply";
  afterChildTurn?: (pause: () => void) => TurnOutcome | undefined;
  withoutSnapshot?: boolean;
}) {
  const scripted = createScriptedTurnRunner();
  const hook: { afterTurn?: (sessionId: string) => TurnOutcome | undefined } = {};
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      const outcome = await scripted.runTurn(request, host);
      return hook.afterTurn?.(request.sessionId) ?? outcome;
    },
  };
  // the same repository without its optional settlementWork: the drain then reads the three counts alone
  const { settlementWork: _, ...separate } = makeService(db.pool).repo;
  const bare: DelegationRepository = separate;
  const { service, repo } = makeService(db.pool, {
    runner,
    ...(setup.withoutSnapshot ? { repo: bare } : {}),
  });
  const caller = await newParent(service);
  const run = await queuedCall(service, caller, "call", scriptTask({ answer: "answered" }));
  const pauses: Promise<void>[] = [];
  const pause = () => {
    pauses.push(service.pauseForRestart());
  };
  hook.afterTurn = (sessionId) =>
    sessionId === run.childSessionId ? setup.afterChildTurn?.(pause) : undefined;
  if (setup.pauseAfter) {
    const target = service.repo as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const write = target[setup.pauseAfter]?.bind(service.repo);
    target[setup.pauseAfter] = async (...args) => {
      const out = await write?.(...args);
      pause();
      return out;
    };
  }
  if (setup.pauseFirst) pause();
  const refusal = await service.executeRun(run).then(
    () => undefined,
    (e: unknown) => e,
  );
  await Promise.all(pauses);
  return {
    refusal,
    run: await repo.getRun(run.id, caller.account.id),
    journal: messages(await repo.readJournal(run.childSessionId ?? "", caller.account.id)),
  };
}

const failed = (): TurnOutcome => ({ stopReason: "error", errorMessage: "the model failed" });

describe("a call interrupted by the restart checkpoint is refused by the write it reached", () => {
  it("a checkpoint before the call starts refuses the call's start", async () => {
    const { refusal, run } = await interruptedCall({ pauseFirst: true });
    expect(refusal).toMatchObject(refused("a call's start"));
    expect(run.status).toBe("queued");
  });

  it("a checkpoint right after the start refuses the first turn's delivery: no turn runs", async () => {
    const { refusal, run, journal } = await interruptedCall({ pauseAfter: "startRun" });
    expect(refusal).toMatchObject(refused("a delivery"));
    expect(journal.map((m) => m.role)).toEqual(["user"]);
    expect(run.status).toBe("running");
  });

  it("a checkpoint as the first turn ends refuses the settlement's look; the call stays open", async () => {
    const { refusal, run, journal } = await interruptedCall({
      afterChildTurn: (pause) => {
        pause();
        return undefined;
      },
    });
    expect(refusal).toMatchObject(refused("a call's settlement"));
    expect(journal.map((m) => m.role)).toEqual(["user", "assistant"]);
    expect(run.status).toBe("running");
    expect(run.settledAt).toBeNull();
  });

  it("a checkpoint as a failed first turn ends refuses the settling mark of its failure", async () => {
    const { refusal, run } = await interruptedCall({
      afterChildTurn: (pause) => {
        pause();
        return failed();
      },
    });
    expect(refusal).toMatchObject(refused("a call's settlement"));
    expect(run.status).toBe("running");
  });

  it("a checkpoint while a failed call is marked settling refuses the notice to its dropped follow-ups", async () => {
    const { refusal, run } = await interruptedCall({ afterChildTurn: failed, pauseAfter: "markRunSettling" });
    expect(refusal).toMatchObject(refused("a call's settlement"));
    expect(run.settledAt).toBeNull();
  });

  it("a checkpoint right after the settlement's look marked the call settling refuses the result's publication", async () => {
    const { refusal, run, journal } = await interruptedCall({ pauseAfter: "markSettlingWithReply" });
    expect(refusal).toMatchObject(refused("a result publication"));
    expect(journal.map((m) => m.role)).toEqual(["user", "assistant"]);
    expect(run.status).toBe("settling");
    expect(run.settledAt).toBeNull();
  });

  it("without the one-snapshot read, a checkpoint as the first turn ends refuses the settling mark", async () => {
    const { refusal, run } = await interruptedCall({
      withoutSnapshot: true,
      afterChildTurn: (pause) => {
        pause();
        return undefined;
      },
    });
    expect(refusal).toMatchObject(refused("a call's settlement"));
    expect(run.settledAt).toBeNull();
  });
});

describe("a workflow summary emitted once the restart checkpoint began", () => {
  it("is refused as a completion: nothing enters the parent's inbox", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const pausing = service.pauseForRestart();
    const refusal = await emitSummary(service, parent.id, account.id).catch((e: unknown) => e);
    await pausing;
    expect(refusal).toMatchObject(refused("a completion"));
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
  });
});

describe("a follow-up turn's own answer", () => {
  it("a drain that takes a helper's result answers with the reply its turn wrote", async () => {
    const { service, repo } = makeService(db.pool);
    const { account, parent } = await newParent(service);
    const child = await repo.getSession(
      await answeredChild(service, { parent, account }, "c", "first"),
      account.id,
    );
    const resultId = await settledHelperResult(repo, child, account.id, "h", "helper says");
    const out = await service.drainPendingResults(
      child,
      parseDelegatedExecutionScope(child.scope ?? ""),
      () => {},
    );
    expect(out).toEqual({ kind: "delivered", resultIds: [resultId], reply: "noted (1)" });
    await service.close();
  });
});

describe("a follow-up turn that ends stopped", () => {
  it("ends the settlement at once, as the caller's stop does: the follow-up still waiting is dropped, not taken", async () => {
    const turns: TurnOutcome[] = [];
    const scripted = createScriptedTurnRunner();
    let childId = "";
    let principal = "";
    const made = makeService(db.pool);
    const runner: SessionTurnRunner = {
      async runTurn(request, host) {
        const outcome = await scripted.runTurn(request, host);
        if (request.sessionId !== childId) return outcome;
        turns.push(outcome);
        // the first turn ends with a follow-up waiting; the follow-up turn that takes it ends stopped (not
        // by the call's signal), with one more follow-up waiting
        if (turns.length === 1) await made.repo.enqueueSteer(childId, principal, "first");
        if (turns.length !== 2) return outcome;
        await made.repo.enqueueSteer(childId, principal, "second");
        return { stopReason: "aborted" };
      },
    };
    const { service, repo } = makeService(db.pool, { runner });
    const caller = await newParent(service);
    principal = caller.account.id;
    const run = await queuedCall(service, caller, "call", scriptTask({ answer: "answered" }));
    childId = run.childSessionId ?? "";
    const resultId = await service.executeRun(run);
    await service.whenIdle();
    expect(turns).toHaveLength(2);
    expect(await repo.getResult(resultId, caller.account.id)).toMatchObject({
      outcome: "error",
      body: "the call was stopped",
    });
    const { rows } = await db.pool.query<{ text: string; status: string; drop_reason: string | null }>(
      "select text, status, drop_reason from delegated_steers where child_session_id = $1 order by created_at",
      [childId],
    );
    expect(rows).toEqual([
      { text: "first", status: "delivered", drop_reason: null },
      { text: "second", status: "dropped", drop_reason: "the call ended: the call was stopped" },
    ]);
  });
});
