import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { type BackgroundCompletion, HostContractError } from "../../src/index.js";
import { delegateForeground, makeService, newParent, queuedCall, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/** A service whose completion emitter records what it is given (and fails when `fail` says). */
async function withEmitter(fail?: string) {
  const emitted: BackgroundCompletion[] = [];
  const made = makeService(db.pool, {
    completionEmitter: async (completion) => {
      emitted.push(completion);
      if (fail) throw new Error(fail);
    },
  });
  const caller = await newParent(made.service);
  return { ...made, caller, emitted };
}

describe("the host's completion emitter", () => {
  it("a foreground call's result is not handed to it: its caller gets the result itself", async () => {
    const { service, caller, emitted } = await withEmitter();
    const receipt = await delegateForeground(service, caller, "fg", scriptTask({ answer: "fg answer" }));
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body: "fg answer" });
    await service.whenIdle();
    expect(emitted).toEqual([]);
    await service.close();
  });

  it("a completion reported again for a call that already settled is not handed to it twice", async () => {
    const { service, repo, caller, emitted } = await withEmitter();
    const run = await queuedCall(service, caller, "bg", scriptTask({ answer: "unused" }));
    const report = (body: string) =>
      service.emitDelegationCompletion({
        kind: "subagent",
        runId: run.id,
        principalAccountId: caller.account.id,
        outcome: "ok",
        body,
      });
    const first = await report("the first report");
    await service.whenIdle();
    expect(emitted.map((c) => c.body)).toEqual(["the first report"]);
    expect(await report("a second report")).toBe(first);
    await service.whenIdle();
    expect(emitted.map((c) => c.body)).toEqual(["the first report"]);
    expect((await repo.getResult(first, caller.account.id)).body).toBe("the first report");
    await service.close();
  });

  it("an emitter that fails is a typed error naming its contract; the call is not settled", async () => {
    const { service, repo, caller, emitted } = await withEmitter("emitter offline");
    const run = await queuedCall(service, caller, "bg", scriptTask({ answer: "unused" }));
    const error = await service
      .emitDelegationCompletion({
        kind: "subagent",
        runId: run.id,
        principalAccountId: caller.account.id,
        outcome: "ok",
        body: "finished",
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HostContractError);
    expect(error).toMatchObject({
      contract: "completion_emitter",
      message: "the host's completion_emitter contract failed: emitter offline",
    });
    expect(emitted).toHaveLength(1);
    expect((await repo.getRun(run.id, caller.account.id)).settledAt).toBeNull();
    await service.close();
  });
});
