import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
} from "../../src/index.js";
import {
  answeredChild,
  delegateForeground,
  makeService,
  newParent,
  scriptTask,
  settledHelperResult,
} from "./helpers.js";

const db = useTestDatabase();

/** The runner pool's startup failure, as the pool throws it: a named class with a string code. */
class RunnerStartupError extends Error {
  override readonly name = "RunnerStartupError";
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** The scripted runner, except while `failing` holds: then the turn cannot start. */
function switchableRunner() {
  const scripted = createScriptedTurnRunner();
  const state = { failing: false, starts: [] as string[] };
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      state.starts.push(request.sessionId);
      if (state.failing)
        throw new RunnerStartupError("boot_timeout", "sub-agent runner did not become ready in time");
      return scripted.runTurn(request, host);
    },
  };
  return { runner, state };
}

describe("typed turn failures", () => {
  it("a thrown runner startup failure ends the turn as data keeping its name and code", async () => {
    const { runner, state } = switchableRunner();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    state.failing = true;
    const outcome = await service.prompt(parent.id, account.id, "hello");
    expect(outcome).toEqual({
      stopReason: "error",
      errorMessage: "sub-agent runner did not become ready in time",
      error: {
        name: "RunnerStartupError",
        code: "boot_timeout",
        message: "sub-agent runner did not become ready in time",
      },
    });
    // The user's input stays journaled; nothing else was written for the turn that never started.
    const journal = await repo.readJournal(parent.id, account.id);
    expect(journal.map((e) => e.body.type === "message" && e.body.message.role)).toEqual(["user"]);
    await service.close();
  });

  it("helper delivery that fails on a runner startup error keeps the native cause for every joined caller; payloads stay as they were", async () => {
    const { runner, state } = switchableRunner();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    const child = await repo.getSession(
      await answeredChild(service, { parent, account }, "c", "first"),
      account.id,
    );
    const resultId = await settledHelperResult(repo, child, account.id, "h", "helper says");
    state.failing = true;
    const scope = parseDelegatedExecutionScope(child.scope ?? "");
    const [a, b] = await Promise.all([
      service.drainPendingResults(child, scope, () => {}),
      service.drainPendingResults(child, scope, () => {}),
    ]);
    expect(a).toBe(b);
    if (a.kind !== "failed") throw new Error(`expected failed, got ${a.kind}`);
    expect(a.resultId).toBe(resultId);
    expect(a.reason).toBe("sub-agent runner did not become ready in time");
    expect(a.cause).toBeInstanceOf(Error);
    expect(a.cause.name).toBe("RunnerStartupError");
    expect((a.cause as Error & { code?: string }).code).toBe("boot_timeout");
    // The committed result is neither requeued nor rewritten.
    expect(await repo.queuedResultIds(child.id, account.id)).toEqual([]);
    expect(await repo.settledResultIds(child.id, account.id)).toEqual([resultId]);
    expect((await repo.getResult(resultId, account.id)).body).toBe("helper says");
    await service.close();
  });

  it("a child whose runner cannot start fails its call with an error result; the parent's payload is unchanged prose", async () => {
    const { runner, state } = switchableRunner();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    state.failing = true;
    const receipt = await delegateForeground(
      service,
      { parent, account },
      "c2",
      scriptTask({ answer: "never" }),
    );
    expect(receipt).toMatchObject({ kind: "result", outcome: "error" });
    if (receipt.kind !== "result") throw new Error("expected a result");
    expect(receipt.body).toContain("sub-agent runner did not become ready in time");
    const run = await repo.getRun(receipt.runId, account.id);
    expect(run.status).toBe("failed");
    expect(run.error?.code).toBe("child_failed");
    // The child's turn was tried once, never again (the parent's own turn on its result may follow).
    expect(state.starts.filter((s) => s === run.childSessionId)).toHaveLength(1);
    await service.close();
  });
});
