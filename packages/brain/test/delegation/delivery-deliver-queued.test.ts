import type { QueuedResult } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type DelegationEvent,
  deliverQueued,
  drainResults,
  resultMessage,
} from "../../src/delegation/delivery.js";
import { makeService, messages, newParent, settledHelperResult } from "./helpers.js";

const db = useTestDatabase();

const queued = (over: Partial<QueuedResult> = {}): QueuedResult => ({
  id: "r-1",
  queueSeq: 1,
  parentSessionId: "p-1",
  childSessionId: "c-1",
  runId: "run-1",
  toolCallId: "call-1",
  kind: "subagent",
  outcome: "ok",
  mode: "background",
  body: "the body",
  byteSize: 8,
  spillPath: null,
  ...over,
});

describe("the parent-facing message of a result", () => {
  it("a child's result names its call, its child and its outcome above the body", () => {
    expect(resultMessage(queued())).toEqual({
      role: "custom",
      customType: "delegation_result",
      content: "[delegation result for call call-1 from child c-1: ok]\nthe body",
      details: { resultId: "r-1", childSessionId: "c-1", runId: "run-1", outcome: "ok", byteSize: 8 },
    });
  });

  it("a result whose child was discarded says so, and carries no child or run id", () => {
    const m = resultMessage(queued({ childSessionId: null, runId: null, outcome: "error" }));
    expect(m).toEqual({
      role: "custom",
      customType: "delegation_result",
      content: "[delegation result for call call-1 from child (discarded): error]\nthe body",
      details: { resultId: "r-1", outcome: "error", byteSize: 8 },
    });
  });

  it("a workflow summary is headed as one, and a spilled body carries its spill path", () => {
    const m = resultMessage(
      queued({ kind: "workflow_summary", childSessionId: null, runId: null, spillPath: "/spill/r-1.txt" }),
    );
    expect(m).toEqual({
      role: "custom",
      customType: "delegation_result",
      content: "[workflow summary for call call-1: ok]\nthe body",
      details: { resultId: "r-1", outcome: "ok", byteSize: 8, spillPath: "/spill/r-1.txt" },
    });
  });
});

/** A root parent with three results waiting in its inbox (bodies one, two, three, in that queue order). */
async function parentWithResults() {
  const { service, repo } = makeService(db.pool);
  const { account, parent } = await newParent(service);
  const ids: string[] = [];
  for (const [i, body] of ["one", "two", "three"].entries())
    ids.push(await settledHelperResult(repo, parent, account.id, `h${i}`, body));
  const events: DelegationEvent[] = [];
  const published: Array<{ parentSessionId: string; ids: string[] }> = [];
  const deps = {
    repo,
    notifier: service.notifier,
    emit: (e: DelegationEvent) => events.push(e),
    onResultDelivered: (e: { parentSessionId: string; delivered: readonly { resultId: string }[] }) => {
      published.push({ parentSessionId: e.parentSessionId, ids: e.delivered.map((d) => d.resultId) });
    },
  };
  return { repo, account, parent, ids, events, published, deps };
}

describe("deliverQueued", () => {
  it("delivers whatever waits, oldest first, answering each result with its journal row", async () => {
    const { repo, account, parent, ids, events, published, deps } = await parentWithResults();
    const out = await deliverQueued(deps, parent.id, account.id);
    expect(out.map((d) => d.result.id)).toEqual(ids);
    expect(out.map((d) => d.result.body)).toEqual(["one", "two", "three"]);
    expect(out.map((d) => d.delivered.resultId)).toEqual(ids);
    const journal = await repo.readJournal(parent.id, account.id);
    for (const d of out) expect(journal.some((e) => e.seq === d.delivered.journalSeq)).toBe(true);
    expect(events).toEqual([
      { type: "delegation.result_delivered", parentSessionId: parent.id, resultIds: ids },
    ]);
    expect(published).toEqual([{ parentSessionId: parent.id, ids }]);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
  });

  it("with a limit delivers only that many of the oldest; the rest stay queued", async () => {
    const { repo, account, parent, ids, deps } = await parentWithResults();
    const out = await deliverQueued(deps, parent.id, account.id, { limit: 2 });
    expect(out.map((d) => d.result.id)).toEqual(ids.slice(0, 2));
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual(ids.slice(2));
  });

  it("with chosen ids delivers only those still waiting, in queue order, and leaves the others queued", async () => {
    const { repo, account, parent, ids, events, published, deps } = await parentWithResults();
    const [a, b, c] = ids as [string, string, string];
    const out = await deliverQueued(deps, parent.id, account.id, { only: [c, a, "not-a-result"] });
    expect(out.map((d) => d.result.id)).toEqual([a, c]);
    expect(out.map((d) => d.result.body)).toEqual(["one", "three"]);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([b]);
    expect(events).toEqual([
      { type: "delegation.result_delivered", parentSessionId: parent.id, resultIds: [a, c] },
    ]);
    expect(published).toEqual([{ parentSessionId: parent.id, ids: [a, c] }]);
    const delivered = messages(await repo.readJournal(parent.id, account.id)).filter(
      (m) => m.role === "custom",
    );
    expect(delivered.map((m) => (m.role === "custom" ? m.details?.resultId : undefined))).toEqual([a, c]);
  });

  it("chosen ids none of which still waits deliver nothing, emit nothing and publish nothing", async () => {
    const { repo, account, parent, ids, events, published, deps } = await parentWithResults();
    await deliverQueued(deps, parent.id, account.id, { only: [ids[0] as string] });
    events.length = 0;
    published.length = 0;
    expect(await deliverQueued(deps, parent.id, account.id, { only: [ids[0] as string, "gone"] })).toEqual(
      [],
    );
    expect(events).toEqual([]);
    expect(published).toEqual([]);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual(ids.slice(1));
  });

  it("an empty inbox delivers nothing, emits nothing and publishes nothing", async () => {
    const { account, parent, events, published, deps } = await parentWithResults();
    await deliverQueued(deps, parent.id, account.id);
    events.length = 0;
    published.length = 0;
    expect(await deliverQueued(deps, parent.id, account.id)).toEqual([]);
    expect(events).toEqual([]);
    expect(published).toEqual([]);
  });

  it("a publication that throws is reported with its message and neither undoes nor repeats the delivery", async () => {
    const { repo, account, parent, ids, events, deps } = await parentWithResults();
    const failing = {
      ...deps,
      onResultDelivered: () => {
        throw new Error("publisher down");
      },
    };
    const out = await deliverQueued(failing, parent.id, account.id);
    expect(out.map((d) => d.result.id)).toEqual(ids);
    expect(events).toEqual([
      { type: "delegation.result_delivered", parentSessionId: parent.id, resultIds: ids },
      { type: "delegation.publish_failed", parentSessionId: parent.id, error: "publisher down" },
    ]);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    expect(await deliverQueued(failing, parent.id, account.id)).toEqual([]);
  });

  it("a publication that rejects with a non-Error is reported as its text", async () => {
    const { account, parent, events, deps } = await parentWithResults();
    await deliverQueued(
      { ...deps, onResultDelivered: () => Promise.reject("plain reason") },
      parent.id,
      account.id,
    );
    expect(events.at(-1)).toEqual({
      type: "delegation.publish_failed",
      parentSessionId: parent.id,
      error: "plain reason",
    });
  });

  it("without a publisher the delivery still emits its event", async () => {
    const { account, parent, ids, events, deps } = await parentWithResults();
    const { onResultDelivered: _, ...bare } = deps;
    expect((await deliverQueued(bare, parent.id, account.id)).length).toBe(3);
    expect(events).toEqual([
      { type: "delegation.result_delivered", parentSessionId: parent.id, resultIds: ids },
    ]);
  });

  it("drainResults answers the journaled messages, one per delivered result", async () => {
    const { account, parent, ids, deps } = await parentWithResults();
    const msgs = await drainResults(deps, parent.id, account.id);
    expect(msgs.map((m) => (m.role === "custom" ? m.details?.resultId : undefined))).toEqual(ids);
    expect(msgs.map((m) => (m.role === "custom" ? m.content.split("\n")[1] : undefined))).toEqual([
      "one",
      "two",
      "three",
    ]);
  });
});
