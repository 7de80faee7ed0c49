import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type DelegationEvent,
  type ProgressEvent,
  RunProgressJob,
  type RunProgressSnapshot,
  recoverDelegations,
} from "../../src/index.js";
import {
  delegateBackground,
  delegateForeground,
  gateTool,
  latch,
  makeService,
  newParent,
  repoWith,
  resultIdsIn,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

const run = { id: "r1", childSessionId: "c1", mode: "background" as const };
const tool = (n: number): ProgressEvent => ({
  type: "tool",
  sessionId: "c1",
  toolName: `T${n}`,
  toolCallId: `${n}`,
});

/** A child's task: two turns that each pass a gate (two progress events), then the answer "done". */
const TWO_GATES = scriptTask({
  rounds: [[{ name: "Gate", arguments: { key: "a" } }], [{ name: "Gate", arguments: { key: "b" } }]],
  answer: "done",
});

/** A publisher that records what it published and when, and can be held mid-write. */
function publisher() {
  const published: { snapshot: RunProgressSnapshot; at: number }[] = [];
  let hold: Promise<void> | undefined;
  return {
    published,
    holdNext(gate: Promise<void>) {
      hold = gate;
    },
    publish: async (snapshot: RunProgressSnapshot) => {
      const gate = hold;
      hold = undefined;
      if (gate) await gate;
      published.push({ snapshot, at: Date.now() });
    },
  };
}

/** An unpaced, foldable job whose first snapshot is being written, held until `held` opens. */
async function oneBeingWritten() {
  const p = publisher();
  const held = latch();
  p.holdNext(held.promise);
  const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 0, foldable: true });
  job.sink(tool(1));
  await new Promise((r) => setImmediate(r));
  return { p, held, job };
}

/**
 * A repository whose first settle fails (a lost connection) before it commits; it counts the settles and
 * the progress writes. `events`: for the service's onEvent.
 */
function firstSettleFails() {
  const counts = { settles: 0, writes: 0 };
  const events: DelegationEvent[] = [];
  const repo = repoWith(db.pool, {
    settleRun: (real) => (result, options) => {
      counts.settles++;
      if (counts.settles === 1) return Promise.reject(new Error("connection terminated while settling"));
      return real(result, options);
    },
    recordRunProgress:
      (real) =>
      (...args) => {
        counts.writes++;
        return real(...args);
      },
  });
  return { repo, events, counts };
}

type Service = ReturnType<typeof makeService>["service"];

/**
 * A background call whose child passes two gates and answers "done", run until the service is idle: its
 * one settle has failed (`failing`), and the call's execution reported that failure.
 */
async function twoGatesInBackground(service: Service, failing: ReturnType<typeof firstSettleFails>) {
  const { account, parent } = await newParent(service);
  const receipt = await delegateBackground(service, { parent, account }, "short", TWO_GATES);
  if (receipt.kind !== "started") throw new Error("expected a started call");
  await service.whenIdle();
  expect(failing.counts.settles).toBe(1);
  expect(failing.events).toContainEqual(
    expect.objectContaining({
      type: "delegation.background_failed",
      error: "connection terminated while settling",
    }),
  );
  return { account, parent, runId: receipt.runId };
}

describe("a call's progress, paced for the run row", () => {
  it("a paced job publishes no sooner than its interval, and only the newest snapshot of what came meanwhile", async () => {
    const p = publisher();
    const began = Date.now();
    const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 150, foldable: false });
    for (const n of [1, 2, 3]) job.sink(tool(n));
    await waitFor(async () => p.published.length > 0, "the first publication");
    expect(p.published.map((x) => x.snapshot.toolCalls)).toEqual([3]);
    // (a timer may fire a millisecond early by the wall clock)
    expect(p.published[0]?.at ?? 0).toBeGreaterThanOrEqual(began + 140);
    job.sink(tool(4));
    await waitFor(async () => p.published.length > 1, "the second publication");
    // the next one waits its interval after the first started
    expect((p.published[1]?.at ?? 0) - (p.published[0]?.at ?? 0)).toBeGreaterThanOrEqual(140);
    await job.drain();
  });

  it("a foldable job hands the settlement the snapshot still waiting instead of publishing it", async () => {
    const p = publisher();
    const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 60_000, foldable: true });
    job.sink(tool(1));
    job.sink(tool(2));
    const folded = await job.drainForSettlement();
    expect(folded).toMatchObject({ seq: 2, toolCalls: 2, lastTool: "T2" });
    expect(p.published).toEqual([]);
    // closed: a later event is no progress of this call
    job.sink(tool(3));
    await job.drain();
    expect(p.published).toEqual([]);
  });

  it("a publication already running is waited for before the settlement takes the newer one", async () => {
    const { p, held, job } = await oneBeingWritten();
    // the first is being written; the second waits behind it
    job.sink(tool(2));
    let folded: RunProgressSnapshot | undefined;
    const draining = job.drainForSettlement().then((s) => {
      folded = s;
    });
    await new Promise((r) => setTimeout(r, 20));
    expect(folded).toBeUndefined();
    held.open();
    await draining;
    expect(p.published.map((x) => x.snapshot.seq)).toEqual([1]);
    expect(folded).toMatchObject({ seq: 2 });
  });

  it("the restart checkpoint's drain publishes a waiting snapshot at once rather than at its paced time", async () => {
    const p = publisher();
    const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 60_000, foldable: true });
    job.sink(tool(1));
    await job.drain();
    expect(p.published.map((x) => x.snapshot.toolCalls)).toEqual([1]);
  });

  it("a settlement after the checkpoint's drain takes nothing: the snapshot the drain hurried is published", async () => {
    const { p, held, job } = await oneBeingWritten();
    // the first is being written, the second waits behind it when the checkpoint drains
    job.sink(tool(2));
    const checkpoint = job.drain();
    const settling = job.drainForSettlement();
    held.open();
    await checkpoint;
    expect(await settling).toBeUndefined();
    expect(p.published.map((x) => x.snapshot.seq)).toEqual([1, 2]);
  });

  it("Ctrl+B's snapshot takes the place of the one still waiting: one write, the newer", async () => {
    const p = publisher();
    const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 60_000, foldable: true });
    job.sink(tool(1));
    await job.background();
    expect(p.published.map((x) => x.snapshot)).toEqual([
      expect.objectContaining({ seq: 2, mode: "background", toolCalls: 1 }),
    ]);
    await job.drain();
    expect(p.published).toHaveLength(1);
  });

  it("a snapshot the settlement took but could not write is published after all", async () => {
    const p = publisher();
    const job = new RunProgressJob(run, p.publish, () => {}, { intervalMs: 60_000, foldable: true });
    job.sink(tool(1));
    const taken = await job.drainForSettlement();
    expect(p.published).toEqual([]);
    if (!taken) throw new Error("expected the waiting snapshot");
    await job.publishUnsettled(taken);
    expect(p.published.map((x) => x.snapshot.seq)).toEqual([1]);
  });

  it("a short call's progress is written with its result: no write of its own, the settled row holds the last snapshot", async () => {
    // an interval no call of a loaded machine outlasts: the test is about the fold, not the default
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", new Map())],
      progressIntervalMs: 60_000,
    });
    let writes = 0;
    const record = repo.recordRunProgress.bind(repo);
    repo.recordRunProgress = async (...args) => {
      writes++;
      return record(...args);
    };
    const { account, parent } = await newParent(service);
    const receipt = await delegateForeground(service, { parent, account }, "short", TWO_GATES);
    if (receipt.kind !== "result") throw new Error("expected a result");
    const settled = await repo.getRun(receipt.runId, account.id);
    expect(settled.status).toBe("succeeded");
    expect(writes).toBe(0);
    expect(JSON.parse(settled.progress ?? "{}")).toMatchObject({
      runId: settled.id,
      toolCalls: 2,
      lastTool: "Gate",
    });
    expect(settled.progressSeq).toBeGreaterThan(0);
    await service.close();
  });

  it("a short call whose settlement fails publishes the snapshot it took; boot recovery then settles it once, the row keeping that progress", async () => {
    const failing = firstSettleFails();
    const { service } = makeService(db.pool, {
      repo: failing.repo,
      tools: () => [gateTool("Gate", new Map())],
      progressIntervalMs: 60_000,
      onEvent: (e) => failing.events.push(e),
    });
    const { account, parent, runId } = await twoGatesInBackground(service, failing);
    // the call stays open, and the snapshot its settlement took is in the row after all: the only write
    const open = await service.repo.getRun(runId, account.id);
    expect(open.status).toBe("settling");
    expect(failing.counts.writes).toBe(1);
    expect(JSON.parse(open.progress ?? "{}")).toMatchObject({ runId, toolCalls: 2, lastTool: "Gate" });
    expect(await service.repo.queuedResultIds(parent.id, account.id)).toEqual([]);
    await service.close();
    // the next boot settles the call with the child's answer, once; its progress stays in the row
    const next = makeService(db.pool);
    await recoverDelegations(next.service);
    const settled = await waitFor(async () => {
      const row = await next.repo.getRun(runId, account.id);
      return row.status === "succeeded" ? row : undefined;
    }, "the recovered call's settlement");
    await waitFor(
      async () => (await next.repo.queuedResultIds(parent.id, account.id)).length === 0,
      "the parent's delivery",
    );
    await next.service.whenIdle();
    expect(JSON.parse(settled.progress ?? "{}")).toMatchObject({ toolCalls: 2, lastTool: "Gate" });
    const results = await db.pool.query("select id, body from delegation_results where run_id = $1", [runId]);
    expect(results.rows).toEqual([{ id: expect.any(String), body: "done" }]);
    // the parent took that one result, once
    expect(resultIdsIn(await next.repo.readJournal(parent.id, account.id))).toEqual([results.rows[0].id]);
    await next.service.close();
  });

  it("with the host's own publication the settlement takes no snapshot: a failed settle publishes nothing more", async () => {
    const failing = firstSettleFails();
    const published: (RunProgressSnapshot | undefined)[] = [];
    const { service } = makeService(db.pool, {
      repo: failing.repo,
      tools: () => [gateTool("Gate", new Map())],
      publishProgress: async (snapshot) => {
        published.push(snapshot);
      },
      onEvent: (e) => failing.events.push(e),
    });
    await twoGatesInBackground(service, failing);
    // every snapshot was published as taken; nothing is handed to the host after the failed settle
    expect(published.length).toBeGreaterThan(0);
    for (const s of published) expect(s).toMatchObject({ seq: expect.any(Number) });
    expect(published.at(-1)).toMatchObject({ toolCalls: 2, lastTool: "Gate" });
    await service.close();
  });

  it("a call that works longer than the interval shows its progress in the row while it is open", async () => {
    const gates = new Map<string, Promise<void>>();
    const hold = latch();
    gates.set("hold", hold.promise);
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      progressIntervalMs: 50,
    });
    const { account, parent } = await newParent(service);
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "long",
      task: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "hold" } }]], answer: "done" }),
      mode: "background",
    });
    if (receipt.kind !== "started") throw new Error("expected a started call");
    const open = await waitFor(async () => {
      const row = await repo.getRun(receipt.runId, account.id);
      return row.progress ? row : undefined;
    }, "the open call's progress in its row");
    expect(open.status).toBe("running");
    expect(JSON.parse(open.progress ?? "{}")).toMatchObject({ toolCalls: 1, lastTool: "Gate" });
    hold.open();
    await service.whenIdle();
    expect((await repo.getRun(receipt.runId, account.id)).status).toBe("succeeded");
    await service.close();
  });
});
