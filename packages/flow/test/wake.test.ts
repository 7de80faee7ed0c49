import { createAppServerHost, DEFAULT_WAKE, type JournalRow, type NewRow, OwnerWaker } from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = defineWorkflow({
  name: "wake",
  run: async (ctx) => ctx.call({ role: "explorer", task: "one", schema: answerSchema }),
});

async function finish(r: InProcessRun, done: Promise<unknown>) {
  const [step] = await r.steps(1);
  if (!step) throw new Error("no step");
  const agent = r.spawn(step, "explorer");
  expect(await r.report(step, agent.threadId)).toBe("bound");
  r.fake.answer(agent.threadId, '{"summary":"s","score":1}');
  expect(await done).toMatchObject({ state: "completed" });
}

const wakes = (r: InProcessRun) =>
  r.rows().filter((x): x is Extract<JournalRow, { type: "session_wake" }> => x.type === "session_wake");

describe("the run wakes its owner", () => {
  it("a step published while the owner is idle stages session_step_waiting as a new owner turn; the wake is a session_wake row (S000-290 S000-299 S000-173)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.fake.completeTurn(r.owner); // the owner's turn ended: idle
    const texts: string[] = [];
    r.fake.onTurnStart((thread, _turn, text) => {
      if (thread === r.owner) texts.push(text);
    });
    r.spec.wake_after_ms = 3_600_000;
    const { done } = r.background(one);
    const [step] = await r.steps(1);
    const row = await waitRow(() => wakes(r)[0]);
    expect(row).toMatchObject({
      renotify: 0,
      ops: ["explorer.1/t1"],
      owner: r.owner,
      owner_status: "idle",
      staged: true,
      wake_id: `run:${r.spec.run_id}/${row.batch}`,
    });
    expect(row.waiting_seconds).toBeGreaterThanOrEqual(0);
    expect(texts).toHaveLength(1);
    expect(texts[0]).toContain("session_step_waiting");
    expect(texts[0]).toContain(`crw flow next ${r.spec.run_id}`);
    expect(step?.marker).toBe("explorer.1/t1-a1");
    await finish(r, done);
    expect(wakes(r)).toHaveLength(1);
  });

  describe("a step waiting unreported while the owner is busy", () => {
    type Wake = Extract<JournalRow, { type: "session_wake" }>;
    let r: InProcessRun;
    let ws: Wake[];
    let texts: string[];
    let published: number;
    let escalations: JournalRow[];
    let escalationsLater: number;
    let result: unknown;
    let deliveries: JournalRow[];
    let wakesAtEnd: number;

    beforeAll(async () => {
      r = await inProcessRun({});
      // the owner is busy: the publish's wake waits for its turn to end (recorded only if it goes out), and
      // the renotifications come whatever its status (each one held for after the turn in place of the one
      // before)
      Object.assign(r.spec, { wake_after_ms: 150, renotify_max_ms: 300, unresponsive_after_ms: 700 });
      texts = [];
      r.fake.onTurnStart((thread, _turn, text) => {
        if (thread === r.owner) texts.push(text);
      });
      const { done } = r.background(one);
      await r.steps(1);
      await waitRow(() => (wakes(r).length >= 4 ? true : undefined), 10_000);
      await waitRow(() => r.rows().find((x) => x.type === "escalation"), 10_000);
      ws = wakes(r);
      published = Date.parse(String(r.rows().find((x) => x.type === "step_published")?.at));
      escalations = r.rows().filter((x) => x.type === "escalation");
      await new Promise((res) => setTimeout(res, 900));
      escalationsLater = r.rows().filter((x) => x.type === "escalation").length;
      const [step] = await r.steps(1);
      if (!step) throw new Error("no step");
      const agent = r.spawn(step, "explorer");
      expect(await r.report(step, agent.threadId)).toBe("bound");
      r.fake.answer(agent.threadId, '{"summary":"s","score":1}');
      result = await done;
      deliveries = r.rows().filter((x) => x.type === "message_delivery");
      wakesAtEnd = wakes(r).length;
    }, 60_000);

    afterAll(async () => {
      await r?.close();
    });

    it("the owner is notified again after WakeAfter though it is busy, each renotification a staged wake of its own (S000-296)", () => {
      expect(ws.slice(0, 4).map((w) => w.renotify)).toEqual([1, 2, 3, 4]);
      expect(ws.every((w) => w.staged && w.delivery === "after_turn" && w.owner_status === "active")).toBe(
        true,
      );
      expect(new Set(ws.map((w) => w.wake_id)).size).toBe(ws.length);
      expect(Date.parse(ws[0]?.at ?? "") - published).toBeGreaterThanOrEqual(150 - 5);
      expect(texts).toEqual([]); // never a turn on the busy owner
      // every wake held for the busy owner was taken over by the next one, the last dropped once the step
      // was bound: none was delivered
      expect(deliveries.length).toBe(wakesAtEnd);
      expect(deliveries.every((d) => d.type === "message_delivery" && !d.delivered)).toBe(true);
      expect(deliveries.at(-1)).toMatchObject({ reason: "no_step_waiting" });
    });

    it("each renotify interval is twice the one before, capped at RenotifyMax (S000-297)", () => {
      // each interval is counted from the round that decided the one before (a row is written a little after
      // its decision, by a varying amount under load), so the schedule shows in the times since publication
      const at = ws.map((w) => Date.parse(w.at) - published);
      expect(at[1]).toBeGreaterThanOrEqual(150 + 300 - 5); // 150 doubled
      expect(at[2]).toBeGreaterThanOrEqual(150 + 300 + 300 - 5); // capped at 300
      // uncapped, the fourth would come at 150 + 300 + 600 + 1200
      expect(at[3]).toBeLessThan(150 + 300 + 600 + 1200 - 450);
    });

    it("after UnresponsiveAfter the escalation is written once, and the run goes on waiting and ends (S000-298)", () => {
      expect(escalations).toHaveLength(1);
      expect(Date.parse(String((escalations[0] as { at: string }).at)) - published).toBeGreaterThanOrEqual(
        700 - 5,
      );
      expect(escalationsLater).toBe(1);
      expect(result).toMatchObject({ state: "completed" });
    });

    it("the escalation is session_unresponsive and carries the owner, the ops, the batch and the waiting seconds (S000-176)", () => {
      expect(escalations[0]).toMatchObject({
        reason: "session_unresponsive",
        owner: r.owner,
        ops: ["explorer.1/t1"],
        batch: ws[0]?.batch,
      });
      // the seconds since the steps began to wait, rounded: at least UnresponsiveAfter (0.7 s here)
      const waited = (escalations[0] as { waiting_seconds: number }).waiting_seconds;
      const since = (Date.parse(String((escalations[0] as { at: string }).at)) - published) / 1000;
      expect(waited).toBeGreaterThanOrEqual(1);
      expect(Math.abs(waited - since)).toBeLessThanOrEqual(0.6);
    });
  });

  it("the owner is notified again after WakeAfter while it is idle: each renotification goes out as a new owner turn (S000-296)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.fake.completeTurn(r.owner); // idle
    Object.assign(r.spec, { wake_after_ms: 150, renotify_max_ms: 300, unresponsive_after_ms: 3_600_000 });
    const texts: string[] = [];
    r.fake.onTurnStart((thread, _turn, text) => {
      if (thread !== r.owner) return;
      texts.push(text);
      setTimeout(() => r.fake.completeTurn(r.owner), 5); // the owner reads the wake and goes idle again
    });
    const { done } = r.background(one);
    await r.steps(1);
    await waitRow(() => (wakes(r).some((w) => w.renotify === 2) ? true : undefined), 10_000);
    const ws = wakes(r);
    expect(ws.slice(0, 3).map((w) => [w.renotify, w.owner_status])).toEqual([
      [0, "idle"],
      [1, "idle"],
      [2, "idle"],
    ]);
    expect(texts.length).toBeGreaterThanOrEqual(3);
    expect(texts.every((t) => t.includes("session_step_waiting"))).toBe(true);
    await finish(r, done);
  });

  it("a wake while the owner is busy is delivered after its current turn, as a new turn; the delivery is a message_delivery row (S000-291)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.wake_after_ms = 3_600_000;
    const texts: string[] = [];
    const turnIds: string[] = [];
    r.fake.onTurnStart((thread, turn, text) => {
      if (thread === r.owner) {
        texts.push(text);
        turnIds.push(turn);
      }
    });
    const { done } = r.background(one);
    await r.steps(1);
    // polls go by while the owner's turn runs: nothing is delivered into it (nor recorded yet)
    await new Promise((res) => setTimeout(res, 6 * (r.spec.poll_ms ?? 20)));
    expect(texts).toEqual([]);
    expect(r.rows().some((x) => x.type === "message_delivery" || x.type === "session_wake")).toBe(false);
    r.fake.completeTurn(r.owner); // the owner's turn ends
    const delivered = await waitRow(() => r.rows().find((x) => x.type === "message_delivery"));
    const staged = wakes(r)[0];
    expect(staged).toMatchObject({
      owner_status: "active",
      staged: true,
      delivery: "after_turn",
      renotify: 0,
    });
    expect(staged?.seq).toBe((delivered as { seq: number }).seq - 1); // recorded with its delivery
    expect(texts).toHaveLength(1);
    expect(texts[0]).toContain(`session_step_waiting (${staged?.wake_id})`);
    expect(delivered).toMatchObject({
      wake_id: staged?.wake_id,
      owner: r.owner,
      delivered: true,
      turn_id: turnIds[0],
      owner_status: "idle",
    });
    expect(wakes(r)).toHaveLength(1); // one wake, one delivery
    await finish(r, done);
  });
});

describe("an owner thread the host has unloaded", () => {
  it("a step published while the owner is notLoaded stages session_step_waiting through run:<id>, delivered by a thread/resume and then a new turn (S000-290 S000-291)", async () => {
    run = await inProcessRun({});
    const r = run;
    r.spec.wake_after_ms = 3_600_000;
    r.fake.completeTurn(r.owner);
    r.fake.setThreadStatus(r.owner, "notLoaded");
    const texts: string[] = [];
    r.fake.onTurnStart((thread, _turn, text) => {
      if (thread === r.owner) texts.push(text);
    });
    const { done } = r.background(one);
    const delivered = await waitRow(() => r.rows().find((x) => x.type === "message_delivery"));
    const row = wakes(r)[0];
    expect(row).toMatchObject({
      owner_status: "notLoaded",
      staged: true,
      delivery: "resume_and_turn",
      wake_id: `run:${r.spec.run_id}/${row?.batch}`,
    });
    expect(delivered).toMatchObject({ wake_id: row?.wake_id, delivered: true, owner_status: "notLoaded" });
    // the owner was resumed first, then given the turn
    const onOwner = r.fake.requests
      .filter((q) => (q.params as { threadId?: string }).threadId === r.owner)
      .map((q) => q.method)
      .filter((m) => m === "thread/resume" || m === "turn/start");
    expect(onOwner).toEqual(["thread/resume", "turn/start"]);
    expect(texts).toHaveLength(1);
    expect(texts[0]).toContain("session_step_waiting");
    await finish(r, done);
  });
});

/**
 * The waker on its default settings, its clock moved by hand: a busy owner's step waits unreported; what
 * its rows held at each moment, in minutes since the publish.
 */
describe("the default wake settings", () => {
  const at = new Map<number, { renotify: number; escalations: number }>();

  beforeAll(async () => {
    const fake = await FakeAppServer.start();
    const host = createAppServerHost({ transport: fake.url });
    try {
      const owner = fake.createOwnerThread({});
      fake.startOwnerTurn(owner); // busy
      const rows: JournalRow[] = [];
      const append = (batch: NewRow[]) => {
        for (const b of batch)
          rows.push({ ...b, seq: rows.length, at: new Date().toISOString() } as JournalRow);
      };
      let clock = 0;
      const ctx = { runId: "r1", owner, host, rows: () => rows, append, nextCommand: "crw flow next r1" };
      const waker = new OwnerWaker(ctx, DEFAULT_WAKE, () => clock);
      waker.onEvent({ type: "step_published", call: "a.1", marker: "a.1/t1-a1", action: "spawn" });
      await waker.tick();
      for (const m of [14.9, 15.1, 44.9, 45.1, 104.9, 105.1, 119.9, 120.1, 164.9, 165.1]) {
        clock = m * 60_000;
        await waker.tick();
        const wakes = rows.filter(
          (x): x is Extract<JournalRow, { type: "session_wake" }> => x.type === "session_wake",
        );
        at.set(m, {
          renotify: Math.max(0, ...wakes.map((w) => w.renotify)),
          escalations: rows.filter((x) => x.type === "escalation").length,
        });
      }
    } finally {
      await host.close();
      await fake.stop();
    }
  });

  it("a run whose spec sets none of them wakes on the defaults: renotified after WakeAfter, capped at RenotifyMax, escalated after UnresponsiveAfter (S000-296 S000-297 S000-298)", async () => {
    // the defaults shortened for the run's real clock: the run must read them, having none of its own
    const saved = { ...DEFAULT_WAKE };
    Object.assign(DEFAULT_WAKE, { wakeAfterMs: 150, renotifyMaxMs: 150, unresponsiveAfterMs: 500 });
    run = await inProcessRun({});
    const r = run;
    try {
      const { done } = r.background(one);
      await r.steps(1);
      const escalation = await waitRow(() => r.rows().find((x) => x.type === "escalation"), 10_000);
      await waitRow(() => (wakes(r).length >= 3 ? true : undefined), 10_000);
      const published = Date.parse(String(r.rows().find((x) => x.type === "step_published")?.at));
      const at = wakes(r).map((w) => Date.parse(w.at) - published);
      expect(at[0]).toBeGreaterThanOrEqual(150 - 5);
      // capped at 150: the third comes at 450, where doubling intervals would put it at 150 + 300 + 600
      expect(at[2]).toBeLessThan(150 + 300 + 600 - 300);
      expect(Date.parse(String(escalation.at)) - published).toBeGreaterThanOrEqual(500 - 5);
      expect(r.rows().filter((x) => x.type === "escalation")).toHaveLength(1);
      Object.assign(DEFAULT_WAKE, saved);
      await finish(r, done);
    } finally {
      Object.assign(DEFAULT_WAKE, saved);
    }
  });

  it("the first renotification comes after WakeAfter, 15 minutes (S000-296)", () => {
    expect([at.get(14.9)?.renotify, at.get(15.1)?.renotify]).toEqual([0, 1]);
  });

  it("each interval doubles up to RenotifyMax, an hour: 30 minutes, then 60, then 60 again (S000-297)", () => {
    expect([at.get(44.9)?.renotify, at.get(45.1)?.renotify]).toEqual([1, 2]);
    expect([at.get(104.9)?.renotify, at.get(105.1)?.renotify]).toEqual([2, 3]);
    // uncapped, the fourth would come 120 minutes after the third
    expect([at.get(164.9)?.renotify, at.get(165.1)?.renotify]).toEqual([3, 4]);
  });

  it("the escalation comes after UnresponsiveAfter, two hours, once (S000-298)", () => {
    expect([at.get(119.9)?.escalations, at.get(120.1)?.escalations, at.get(165.1)?.escalations]).toEqual([
      0, 1, 1,
    ]);
  });
});

describe("a held wake and a later one", () => {
  it("a renotification that goes out at once takes the place of the wake held for after the busy turn: the owner gets one turn (S000-291)", async () => {
    run = await inProcessRun({});
    const r = run;
    Object.assign(r.spec, { wake_after_ms: 300, renotify_max_ms: 3_600_000 });
    const texts: string[] = [];
    r.fake.onTurnStart((thread, _turn, text) => {
      if (thread === r.owner) texts.push(text);
    });
    const { done } = r.background(one);
    await r.steps(1); // published while the owner is busy: held
    await new Promise((res) => setTimeout(res, 6 * (r.spec.poll_ms ?? 20))); // the publish's round ran
    // the owner's turn ends and its thread shows neither idle nor busy (in one step: no round sees idle):
    // the held wake waits on
    r.fake.completeTurn(r.owner);
    r.fake.setThreadStatus(r.owner, "systemError");
    const delivered = await waitRow(() => r.rows().find((x) => x.type === "message_delivery"));
    expect(delivered).toMatchObject({ delivered: true, owner_status: "systemError" });
    expect(wakes(r)).toEqual([expect.objectContaining({ renotify: 1, staged: true, delivery: "new_turn" })]);
    r.fake.completeTurn(r.owner); // the woken turn ends: the owner is idle
    r.fake.setThreadStatus(r.owner, "idle");
    await new Promise((res) => setTimeout(res, 6 * (r.spec.poll_ms ?? 20)));
    expect(texts).toHaveLength(1); // the held wake did not go out as well
    expect(wakes(r)).toHaveLength(1);
    expect(r.rows().filter((x) => x.type === "message_delivery")).toHaveLength(1);
    await finish(r, done);
  });
});

describe("OwnerWaker wake ids", () => {
  it("the id is (run, process, batch): the n-th process wakes under <batch>/e<n>; a wake the relay already held stages nothing (S000-292 S000-293 S000-294)", async () => {
    const fake = await FakeAppServer.start();
    const host = createAppServerHost({ transport: fake.url });
    try {
      const owner = fake.createOwnerThread({});
      const rows: JournalRow[] = [];
      let seq = 0;
      const append = (batch: NewRow[]) => {
        for (const b of batch) rows.push({ ...b, seq: seq++, at: new Date().toISOString() } as JournalRow);
      };
      const started = {
        type: "started",
        backend: "session",
        role_pairs: {},
        policy_digest: "d",
        process: null,
        pid: 1,
        process_n: 1,
      } as unknown as NewRow;
      append([started]);
      const cfg = { wakeAfterMs: 3_600_000, renotifyMaxMs: 3_600_000, unresponsiveAfterMs: 3_600_000 };
      const ctx = { runId: "r1", owner, host, rows: () => rows, append, nextCommand: "crw flow next r1" };
      const turns: string[] = [];
      fake.onTurnStart((t, _id, text) => {
        if (t === owner) turns.push(text);
      });
      const publish = (w: OwnerWaker, marker: string) =>
        w.onEvent({ type: "step_published", call: marker.split("/")[0] ?? "", marker, action: "spawn" });

      const first = new OwnerWaker(ctx, cfg);
      publish(first, "a.1/t1-a1");
      publish(first, "b.1/t1-a1");
      await first.tick();
      const w1 = rows.filter((x) => x.type === "session_wake");
      expect(w1).toHaveLength(1);
      const batch = (w1[0] as { batch: string }).batch;
      expect(w1[0]).toMatchObject({ wake_id: `run:r1/${batch}`, staged: true, ops: ["a.1/t1", "b.1/t1"] });
      fake.completeTurn(owner);

      // the same process stages the same steps again: the relay holds the id already
      const again = new OwnerWaker(ctx, cfg);
      publish(again, "b.1/t1-a1");
      publish(again, "a.1/t1-a1");
      await again.tick();
      const w2 = rows.filter((x) => x.type === "session_wake");
      expect(w2[1]).toMatchObject({ wake_id: `run:r1/${batch}`, staged: false, reason: "already_held" });
      expect(turns).toHaveLength(1);
      fake.completeTurn(owner);

      // another set of waiting steps is another batch: a new message
      const other = new OwnerWaker(ctx, cfg);
      publish(other, "a.1/t1-a1");
      await other.tick();
      const w4 = rows.filter((x) => x.type === "session_wake");
      expect(w4[2]).toMatchObject({ ops: ["a.1/t1"], staged: true });
      expect((w4[2] as { batch: string }).batch).not.toBe(batch);
      expect(turns).toHaveLength(2);
      fake.completeTurn(owner);

      // a resume: the run's second process wakes under <batch>/e2, a new message
      append([{ ...(started as object), process_n: 2 } as NewRow]);
      const resumed = new OwnerWaker(ctx, cfg);
      publish(resumed, "a.1/t1-a1");
      publish(resumed, "b.1/t1-a1");
      await resumed.tick();
      const w3 = rows.filter((x) => x.type === "session_wake");
      expect(w3[3]).toMatchObject({ wake_id: `run:r1/${batch}/e2`, staged: true });
      expect(turns).toHaveLength(3);
    } finally {
      await host.close();
      await fake.stop();
    }
  });
});

describe("a session_wake row's outcome", () => {
  it("a wake the host refuses is staged: false with the host's error; one the relay already holds is staged: false with reason already_held (S000-173)", async () => {
    const fake = await FakeAppServer.start();
    const real = createAppServerHost({ transport: fake.url });
    try {
      const owner = fake.createOwnerThread({});
      const rows: JournalRow[] = [];
      const append = (batch: NewRow[]) => {
        for (const b of batch)
          rows.push({ ...b, seq: rows.length, at: new Date().toISOString() } as JournalRow);
      };
      append([{ type: "started", process_n: 1 } as unknown as NewRow]);
      const cfg = { wakeAfterMs: 3_600_000, renotifyMaxMs: 3_600_000, unresponsiveAfterMs: 3_600_000 };
      const base = { runId: "r1", owner, rows: () => rows, append, nextCommand: "crw flow next r1" };
      const refusing = {
        ...real,
        startTurn: async () => ({
          ok: false as const,
          reason: "unreachable" as const,
          message: "socket closed",
        }),
      };
      const wakeOnce = async (host: typeof real) => {
        const w = new OwnerWaker({ ...base, host }, cfg);
        w.onEvent({ type: "step_published", call: "a.1", marker: "a.1/t1-a1", action: "spawn" });
        await w.tick();
        const all = rows.filter((x) => x.type === "session_wake");
        return all.at(-1) as Extract<JournalRow, { type: "session_wake" }>;
      };
      const common = { renotify: 0, ops: ["a.1/t1"], owner, owner_status: "idle" };

      const failed = await wakeOnce(refusing);
      expect(failed).toMatchObject({ ...common, staged: false, error: "unreachable: socket closed" });
      expect(failed.batch).toMatch(/\S/);
      expect(failed.wake_id).toBe(`run:r1/${failed.batch}`);
      expect(failed.waiting_seconds).toBeGreaterThanOrEqual(0);
      expect("reason" in failed).toBe(false);

      const staged = await wakeOnce(real);
      expect(staged).toMatchObject({ ...common, staged: true, wake_id: failed.wake_id });
      expect("error" in staged || "reason" in staged).toBe(false);
      fake.completeTurn(owner);

      const held = await wakeOnce(real);
      expect(held).toMatchObject({
        ...common,
        staged: false,
        reason: "already_held",
        wake_id: failed.wake_id,
      });
      expect("error" in held).toBe(false);
    } finally {
      await real.close();
      await fake.stop();
    }
  });
});

describe("the owner's status between reads", () => {
  it("is read again after a notification of the owner thread, after a poll interval and after a turn the waker starts; not in between", async () => {
    const fake = await FakeAppServer.start();
    const real = createAppServerHost({ transport: fake.url });
    try {
      const owner = fake.createOwnerThread({});
      fake.startOwnerTurn(owner);
      let reads = 0;
      const host = {
        ...real,
        readStatus: (id: string) => {
          reads++;
          return real.readStatus?.(id) ?? Promise.reject(new Error("no readStatus"));
        },
      };
      const rows: JournalRow[] = [];
      const append = (batch: NewRow[]) => {
        for (const b of batch)
          rows.push({ ...b, seq: rows.length, at: new Date().toISOString() } as JournalRow);
      };
      let version = 0;
      let clock = 0;
      const ctx = {
        ...{ runId: "r1", owner, host, rows: () => rows, append, nextCommand: "crw flow next r1" },
        hostVersion: () => version,
        statusFreshMs: 100,
      };
      const cfg = { wakeAfterMs: 3_600_000, renotifyMaxMs: 3_600_000, unresponsiveAfterMs: 3_600_000 };
      const waker = new OwnerWaker(ctx, cfg, () => clock);
      const publish = (marker: string) =>
        waker.onEvent({ type: "step_published", call: marker.split("/")[0] ?? "", marker, action: "spawn" });
      publish("a.1/t1-a1");
      await waker.tick(); // the owner is busy: the wake waits for its turn
      expect(reads).toBe(1);
      publish("b.1/t1-a1");
      clock = 50;
      await waker.tick(); // no notification, within the interval: the status read holds
      expect(reads).toBe(1);
      version++;
      await waker.tick(); // the owner thread changed
      expect(reads).toBe(2);
      clock = 160;
      await waker.tick(); // a poll interval passed with no notification
      expect(reads).toBe(3);
      fake.completeTurn(owner);
      version++;
      const turns: string[] = [];
      fake.onTurnStart((t, _id, text) => {
        if (t === owner) turns.push(text);
      });
      await waker.tick(); // idle: the held wake goes out as a turn of the owner
      expect(turns).toHaveLength(1);
      expect(reads).toBe(4);
      publish("c.1/t1-a1");
      await waker.tick(); // the turn it started makes the owner busy again: read, not taken as idle
      expect(reads).toBe(5);
    } finally {
      await real.close();
      await fake.stop();
    }
  });
});

async function waitRow<T>(get: () => T | undefined, ms = 5_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = get();
    if (v) return v;
    if (Date.now() > deadline) throw new Error("row not written in time");
    await new Promise((r) => setTimeout(r, 20));
  }
}
