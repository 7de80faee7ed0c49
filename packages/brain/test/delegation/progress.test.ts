import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import type { DelegationEvent, ProgressEvent, RunProgressSnapshot } from "../../src/index.js";
import {
  delegateForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  resultIdsIn,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** Short enough for a test, long enough that a child waiting on its gate is the only silence. */
const STALL_MS = 300;

const gateCalls = (keys: string[]) => keys.map((key) => [{ name: "Gate", arguments: { key } }]);

/** A slow host publication that records order, overlap and what the rows said while it ran. */
function recordingPublisher(delayMs = 15) {
  const published: RunProgressSnapshot[] = [];
  const state = { inFlight: 0, maxInFlight: 0, calls: 0 };
  const publish = async (snapshot: RunProgressSnapshot) => {
    state.calls++;
    state.inFlight++;
    state.maxInFlight = Math.max(state.maxInFlight, state.inFlight);
    try {
      await new Promise((r) => setTimeout(r, delayMs));
      const { rows } = await db.pool.query<{ status: string; results: string }>(
        `select r.status, (select count(*) from delegation_results d where d.run_id = r.id)::text as results
           from subagent_runs r where r.id = $1`,
        [snapshot.runId],
      );
      expect(rows[0]?.status).not.toMatch(/succeeded|failed|aborted/);
      expect(rows[0]?.results).toBe("0");
      published.push(snapshot);
    } finally {
      state.inFlight--;
    }
  };
  return { publish, published, state };
}

describe("progress publication of a delegation's job", () => {
  it("a foreground call's snapshots are taken per event, published one at a time in order, and drained before it settles (S004-229 S004-230)", async () => {
    const gates = new Map<string, Promise<void>>();
    const pub = recordingPublisher();
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      publishProgress: pub.publish,
    });
    const { account, parent } = await newParent(service);
    const events: ProgressEvent[] = [];
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "fg",
      task: scriptTask({ rounds: gateCalls(["a", "b", "c", "d"]), answer: "four gates" }),
      mode: "foreground",
      progress: (e) => events.push(e),
    });
    // At the foreground return every publication has settled: none is running and the newest one is final.
    expect(pub.state.inFlight).toBe(0);
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body: "four gates" });
    expect(pub.state.maxInFlight).toBe(1);
    const seqs = pub.published.map((s) => s.seq);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    expect(new Set(seqs).size).toBe(seqs.length);
    const last = pub.published.at(-1);
    expect(last).toMatchObject({ toolCalls: 4, lastTool: "Gate", mode: "foreground" });
    // Each snapshot is immutable: what was published is what the job knew when it took it.
    for (const s of pub.published) expect(Object.isFrozen(s)).toBe(true);
    const toolCounts = pub.published.map((s) => s.toolCalls);
    expect(toolCounts).toEqual([...toolCounts].sort((a, b) => a - b));
    // The caller's own sink still saw every event; identity events are not progress snapshots.
    expect(events.filter((e) => e.type === "tool")).toHaveLength(4);
    expect(events[0]).toMatchObject({ type: "session" });
    if (receipt.kind !== "result") throw new Error("expected a result");
    expect((await repo.getRun(receipt.runId, account.id)).status).toBe("succeeded");
    await service.close();
  });

  it("a background call drains its publication before its result enters the inbox (S004-230)", async () => {
    const gates = new Map<string, Promise<void>>();
    const pub = recordingPublisher(25);
    const steered: string[] = [];
    const { service } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      publishProgress: pub.publish,
      onEvent: (e: DelegationEvent) => {
        if (e.type === "delegation.result_steered") {
          // The result is in the inbox now: nothing of this call's progress may still be publishing.
          expect(pub.state.inFlight).toBe(0);
          steered.push(e.resultId);
        }
      },
    });
    const { account, parent } = await newParent(service);
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "bg",
      task: scriptTask({ rounds: gateCalls(["a", "b", "c"]), answer: "bg done" }),
      mode: "background",
    });
    expect(receipt.kind).toBe("started");
    await service.whenIdle();
    expect(steered).toHaveLength(1);
    expect(pub.published.at(-1)).toMatchObject({ toolCalls: 3, mode: "background" });
    expect(pub.state.maxInFlight).toBe(1);
    await service.close();
  });

  it("the default publication writes only the run's progress columns; the host-owned scope column is kept (S004-219)", async () => {
    const { service, repo } = makeService(db.pool, { tools: () => [gateTool("Gate", new Map())] });
    const { account, parent } = await newParent(service, { isOwner: true });
    const first = await delegateForeground(
      service,
      { parent, account },
      "d1",
      scriptTask({ answer: "ready" }),
    );
    if (first.kind !== "result") throw new Error("expected a result");
    // A continuation from a planning turn: its read-only clamp is bound to the row before dispatch.
    const cont = await service.continueSubagent({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      childSessionId: first.childSessionId,
      toolCallId: "c1",
      text: scriptTask({ rounds: gateCalls(["x", "y"]), answer: "looked" }),
      mode: "foreground",
      callerReadOnly: true,
    });
    if (cont.kind !== "result") throw new Error("expected a result");
    const run = await repo.getRun(cont.runId, account.id);
    expect(run.readOnlyScope).not.toBeNull();
    expect(JSON.parse(run.readOnlyScope ?? "{}")).toMatchObject({ readOnly: true });
    expect(run.progressSeq).toBeGreaterThan(0);
    expect(JSON.parse(run.progress ?? "{}")).toMatchObject({ runId: run.id, toolCalls: 2, lastTool: "Gate" });
    // A late, stale or post-settlement write changes nothing.
    expect(await repo.recordRunProgress(run.id, account.id, run.generation, 999, "{}")).toBe(false);
    const again = await repo.getRun(cont.runId, account.id);
    expect(again.progress).toBe(run.progress);
    expect(again.readOnlyScope).toBe(run.readOnlyScope);
    await service.close();
  });

  it("a stalled foreground call's background row is written, then its snapshot published, and only then is its waiter let go; the result arrives once, through the inbox (S004-231)", async () => {
    const gates = new Map<string, Promise<void>>();
    const gate = latch();
    gates.set("hold", gate.promise);
    const pub = recordingPublisher(5);
    const order: string[] = [];
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      publishProgress: async (snapshot) => {
        await pub.publish(snapshot);
        if (snapshot.mode === "background") order.push("background snapshot published");
      },
      stallAfterMs: STALL_MS,
    });
    const move = repo.moveRunToBackground.bind(repo);
    repo.moveRunToBackground = async (...args) => {
      const moved = await move(...args);
      order.push("row moved");
      return moved;
    };
    const { account, parent } = await newParent(service);
    // The child waits on its gate in silence, so the stall watchdog lets the waiter go (Ctrl+B's move).
    const released = await service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "stalled",
        task: scriptTask({ rounds: gateCalls(["hold"]), answer: "finished later" }),
        mode: "foreground",
      })
      .then(async (receipt) => {
        order.push("waiter released");
        // When the waiter is released, the row and the background snapshot are already durable.
        if (receipt.kind === "steered") throw new Error("expected a call");
        const row = await repo.getRun(receipt.runId, account.id);
        return { receipt, mode: row.mode, lastPublished: pub.published.at(-1) };
      });
    expect(released.receipt).toMatchObject({ kind: "started" });
    expect(released.mode).toBe("background");
    expect(released.lastPublished).toMatchObject({ mode: "background" });
    expect(order).toEqual(["row moved", "background snapshot published", "waiter released"]);
    gate.open();
    const delivered = await waitFor(async () => {
      const ids = resultIdsIn(await repo.readJournal(parent.id, account.id));
      return ids.length > 0 ? ids : undefined;
    }, "the background result in the parent's journal");
    await service.whenIdle();
    expect(resultIdsIn(await repo.readJournal(parent.id, account.id))).toEqual(delivered);
    expect(delivered).toHaveLength(1);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    await service.close();
  });

  it("a failed background write is diagnosed and leaves the stalled call's waiter attached; outcomes stay typed (S004-231 S004-234)", async () => {
    const gates = new Map<string, Promise<void>>();
    const gate = latch();
    gates.set("hold", gate.promise);
    const events: DelegationEvent[] = [];
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      onEvent: (e) => events.push(e),
      publishProgress: async (snapshot) => {
        if (snapshot.mode === "background") throw new Error("progress store unavailable");
      },
      stallAfterMs: STALL_MS,
    });
    const { account, parent } = await newParent(service);
    let settledFirst = false;
    const waiting = service
      .delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "stalled-fail",
        task: scriptTask({ rounds: gateCalls(["hold"]), answer: "still foreground" }),
        mode: "foreground",
      })
      .then((r) => {
        settledFirst = true;
        return r;
      });
    const failed = await waitFor(
      async () => events.find((e) => e.type === "delegation.progress_failed"),
      "the watchdog's move to fail",
    );
    expect(failed).toMatchObject({ code: "progress_publication_failed" });
    expect(
      await waitFor(async () => events.find((e) => e.type === "delegation.stalled"), "the stall diagnosed"),
    ).toMatchObject({ moved: false, error: expect.stringContaining("progress store unavailable") });
    await new Promise((r) => setTimeout(r, 50));
    expect(settledFirst).toBe(false);
    gate.open();
    const receipt = await waiting;
    // The waiter stayed attached: it gets the call's result, ok as ever.
    expect(receipt).toMatchObject({ kind: "result", outcome: "ok", body: "still foreground" });
    await service.whenIdle();
    // Delivered exactly once although the row had become a background call.
    expect(resultIdsIn(await repo.readJournal(parent.id, account.id))).toHaveLength(1);
    await service.close();
  });

  it("progress publication failures change no call outcome; each is diagnosed with its code (S004-234)", async () => {
    const events: DelegationEvent[] = [];
    const { service } = makeService(db.pool, {
      tools: () => [gateTool("Gate", new Map())],
      onEvent: (e) => events.push(e),
      publishProgress: async () => {
        throw new Error("no route to the progress store");
      },
    });
    const { account, parent } = await newParent(service);
    const ok = await delegateForeground(
      service,
      { parent, account },
      "ok",
      scriptTask({ rounds: gateCalls(["a"]), answer: "fine" }),
    );
    expect(ok).toMatchObject({ kind: "result", outcome: "ok", body: "fine" });
    const failed = await delegateForeground(
      service,
      { parent, account },
      "bad",
      scriptTask({ rounds: gateCalls(["a"]), failAtRequest: 1 }),
    );
    expect(failed).toMatchObject({ kind: "result", outcome: "error" });
    const diagnosed = events.filter((e) => e.type === "delegation.progress_failed");
    expect(diagnosed.length).toBeGreaterThan(0);
    for (const d of diagnosed) expect(d).toMatchObject({ code: "progress_publication_failed" });
    await service.close();
  });

  it("progress is published only after the admitted call's session event; a refused admission publishes nothing (S004-217)", async () => {
    const pub = recordingPublisher(0);
    const order: string[] = [];
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", new Map())],
      publishProgress: async (snapshot) => {
        const { rowCount } = await db.pool.query("select 1 from subagent_runs where id = $1", [
          snapshot.runId,
        ]);
        order.push(`published, row ${rowCount}`);
        await pub.publish(snapshot);
      },
    });
    const { account, parent } = await newParent(service);
    const first = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "d",
      task: scriptTask({ rounds: gateCalls(["a", "b"]), answer: "ready" }),
      mode: "foreground",
      progress: (e) => order.push(e.type),
    });
    if (first.kind !== "result") throw new Error("expected a result");
    // The admitted call's session event comes first; every publication follows it, of a committed row.
    expect(order[0]).toBe("session");
    const published = order.filter((o) => o.startsWith("published"));
    expect(published.length).toBeGreaterThan(0);
    expect(new Set(published)).toEqual(new Set(["published, row 1"]));
    await service.whenIdle();
    const before = pub.state.calls;
    const resultsBefore = await repo.settledResultIds(parent.id, account.id);
    const events: ProgressEvent[] = [];
    await expect(
      service.continueSubagent({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        childSessionId: first.childSessionId,
        toolCallId: "c-refused",
        text: "write something",
        mode: "foreground",
        callerReadOnly: true,
        writeAccess: true,
        progress: (e) => events.push(e),
      }),
    ).rejects.toMatchObject({ code: "write_access_refused" });
    await expect(
      service.delegate({
        parentSessionId: parent.id,
        principalAccountId: account.id,
        toolCallId: "d-refused",
        task: "elsewhere",
        mode: "background",
        workDir: "/",
        progress: (e) => events.push(e),
      }),
    ).rejects.toMatchObject({ code: "work_dir_not_permitted" });
    await service.whenIdle();
    expect(events).toEqual([]);
    expect(pub.state.calls).toBe(before);
    expect(await repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    expect(await repo.settledResultIds(parent.id, account.id)).toEqual(resultsBefore);
    expect(await repo.runForToolCall(parent.id, "c-refused", account.id)).toBeNull();
    expect(await repo.runForToolCall(parent.id, "d-refused", account.id)).toBeNull();
    await service.close();
  });
});
