import { readFileSync } from "node:fs";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type BackgroundCompletion,
  type DelegationEvent,
  FileSpillStore,
  HostContractError,
  type OutputRecipient,
  recoverDelegations,
} from "../../src/index.js";
import {
  delegateBackground,
  latch,
  makeService,
  messages,
  newParent,
  resultIdsIn,
  scratchDir,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

async function resultRows(runId: string): Promise<number> {
  const { rows } = await db.pool.query("select 1 from delegation_results where run_id = $1", [runId]);
  return rows.length;
}

describe("asynchronous host contracts of a result's preparation", () => {
  it("background completion awaits the host's completion emitter before the inbox handoff (S004-232)", async () => {
    const gate = latch();
    const emitted: BackgroundCompletion[] = [];
    const { service, repo } = makeService(db.pool, {
      completionEmitter: async (completion) => {
        emitted.push(completion);
        await gate.promise;
      },
    });
    const { account, parent } = await newParent(service);
    const receipt = await delegateBackground(
      service,
      { parent, account },
      "bg",
      scriptTask({ answer: "emitted answer" }),
    );
    if (receipt.kind !== "started") throw new Error("expected a background call");
    await waitFor(async () => emitted.length === 1, "the emitter to be called");
    // While the emitter has not resolved, nothing is settled or delivered.
    expect(await resultRows(receipt.runId)).toBe(0);
    expect((await repo.getRun(receipt.runId, account.id)).status).toBe("settling");
    expect(resultIdsIn(await repo.readJournal(parent.id, account.id))).toEqual([]);
    expect(emitted[0]).toMatchObject({
      runId: receipt.runId,
      parentSessionId: parent.id,
      childSessionId: receipt.childSessionId,
      toolCallId: "bg",
      outcome: "ok",
      body: "emitted answer",
    });
    gate.open();
    await waitFor(
      async () => resultIdsIn(await repo.readJournal(parent.id, account.id)).length === 1,
      "the delivery",
    );
    await service.whenIdle();
    // The id the emitter was given is the id that was delivered.
    expect(resultIdsIn(await repo.readJournal(parent.id, account.id))).toEqual([emitted[0]?.resultId]);
    expect((await repo.getRun(receipt.runId, account.id)).status).toBe("succeeded");
    await service.close();
  });

  it("a rejecting completion emitter is a typed error; the call stays open and recovery settles it once (S004-232)", async () => {
    const events: DelegationEvent[] = [];
    const first = makeService(db.pool, {
      completionEmitter: async () => {
        throw new Error("emitter offline");
      },
      onEvent: (e) => events.push(e),
    });
    await first.service.start();
    const { account, parent } = await newParent(first.service);
    const receipt = await delegateBackground(
      first.service,
      { parent, account },
      "bg",
      scriptTask({ answer: "kept answer" }),
    );
    if (receipt.kind !== "started") throw new Error("expected a background call");
    await first.service.whenIdle();
    expect(events).toContainEqual(
      expect.objectContaining({ type: "delegation.background_failed", code: "host_contract_failed" }),
    );
    expect(await resultRows(receipt.runId)).toBe(0);
    expect((await first.repo.getRun(receipt.runId, account.id)).status).toBe("settling");
    await first.service.close();

    const emitted: BackgroundCompletion[] = [];
    const second = makeService(db.pool, {
      completionEmitter: async (c) => {
        emitted.push(c);
      },
    });
    const report = await recoverDelegations(second.service).finally(() => second.service.whenIdle());
    await second.service.close();
    expect(report.settledWithoutTurn).toEqual([receipt.runId]);
    expect(emitted.map((c) => c.body)).toEqual(["kept answer"]);
    const journal = await second.repo.readJournal(parent.id, account.id);
    expect(resultIdsIn(journal)).toEqual([emitted[0]?.resultId]);
    expect(messages(journal).find((m) => m.role === "custom")?.content).toContain("kept answer");
  });

  it("the inline-byte limit and the recipient's output-writer capture are awaited before anything is stored (S004-233)", async () => {
    const limitGate = latch();
    const writerGate = latch();
    const captured: OutputRecipient[] = [];
    const writerRoot = scratchDir("crw-writer-");
    let limitAsked = 0;
    const { service, repo } = makeService(db.pool, {
      toolResultInlineBytes: async () => {
        limitAsked++;
        await limitGate.promise;
        return 32;
      },
      captureOutputWriter: async (recipient) => {
        captured.push(recipient);
        await writerGate.promise;
        return new FileSpillStore(writerRoot);
      },
    });
    const { account, parent } = await newParent(service);
    const body = `a long answer ${"y".repeat(500)} end`;
    const receipt = await delegateBackground(
      service,
      { parent, account },
      "bg",
      scriptTask({ answer: body }),
    );
    if (receipt.kind !== "started") throw new Error("expected a background call");
    await waitFor(async () => limitAsked === 1, "the limit to be asked");
    expect(captured).toEqual([]);
    expect(await resultRows(receipt.runId)).toBe(0);
    limitGate.open();
    await waitFor(async () => captured.length === 1, "the writer capture");
    expect(captured[0]).toEqual({ sessionId: parent.id, principalAccountId: account.id });
    expect(await resultRows(receipt.runId)).toBe(0);
    writerGate.open();
    await waitFor(
      async () => resultIdsIn(await repo.readJournal(parent.id, account.id)).length === 1,
      "the delivery",
    );
    await service.whenIdle();
    const delivered = messages(await repo.readJournal(parent.id, account.id)).find(
      (m) => m.role === "custom",
    );
    const path = delivered?.role === "custom" ? (delivered.details?.spillPath ?? "") : "";
    // The captured writer stored the complete bytes; the parent got the bounded placeholder.
    expect(path.startsWith(writerRoot)).toBe(true);
    expect(readFileSync(path, "utf8")).toBe(body);
    await service.close();
  });

  it("a rejecting writer capture is a typed error for the caller; nothing is lost (S004-233)", async () => {
    const first = makeService(db.pool, {
      toolResultInlineBytes: async () => 32,
      captureOutputWriter: async () => {
        throw new Error("no writer for this recipient");
      },
    });
    await first.service.start();
    const { account, parent } = await newParent(first.service);
    const body = `foreground answer ${"z".repeat(400)}`;
    const error = await first.service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "fg",
        task: scriptTask({ answer: body }),
        mode: "foreground",
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HostContractError);
    expect(error).toMatchObject({ code: "host_contract_failed", contract: "output_writer" });
    const run = await first.repo.runForToolCall(parent.id, "fg", account.id);
    if (!run) throw new Error("expected the run");
    expect(run.status).toBe("settling");
    expect(await resultRows(run.id)).toBe(0);
    await first.service.close();

    const second = makeService(db.pool, { toolResultInlineBytes: async () => 32 });
    await recoverDelegations(second.service).finally(() => second.service.whenIdle());
    await second.service.close();
    const delivered = messages(await second.repo.readJournal(parent.id, account.id)).filter(
      (m) => m.role === "custom",
    );
    expect(delivered).toHaveLength(1);
    const path = delivered[0]?.role === "custom" ? (delivered[0].details?.spillPath ?? "") : "";
    expect(readFileSync(path, "utf8")).toBe(body);
  });
});
