import { type JournalRow, readJournalFile } from "@crw/flow";
import { afterEach, describe, expect, it, vi } from "vitest";
import { defineWorkflow, type InProcessRun, inProcessRun, countSchema as schema } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const two = defineWorkflow({
  name: "two",
  run: (ctx) =>
    Promise.all([
      ctx.call({ role: "explorer", task: "a", schema }),
      ctx.call({ role: "reviewer", task: "b", schema }),
    ]),
});
const callRows = (rows: JournalRow[], call: string) => rows.filter((r) => "call" in r && r.call === call);
async function until(what: string, check: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("held calls", () => {
  it("a held call's step that was published and not bound is looked up by its marker before a new attempt (S000-153)", async () => {
    run = await inProcessRun();
    const first = run.background(two);
    const steps = await run.steps(2);
    const ex = steps.find((s) => s.call === "explorer.1");
    const rv = steps.find((s) => s.call === "reviewer.1");
    if (!ex || !rv) throw new Error("steps");
    const a = run.spawn(ex, "explorer");
    expect(await run.report(ex, a.threadId)).toBe("bound");
    // the owner spawned the reviewer's subagent and never reported it; then the run pauses
    const b = run.spawn(rv, "reviewer");
    run.fake.failTurn(a.threadId, "internalServerError");
    expect(await first.done).toMatchObject({ state: "paused" });
    expect(callRows(run.rows(), "reviewer.1").map((r) => r.type)).toEqual([
      "prepared",
      "step_published",
      "held",
    ]);
    const second = run.background(two);
    await until("the reviewer's subagent to be bound", () =>
      callRows(run?.rows() ?? [], "reviewer.1").some((r) => r.type === "thread_started"),
    );
    const ts = callRows(run.rows(), "reviewer.1").find((r) => r.type === "thread_started");
    expect(ts).toMatchObject({ thread_id: b.threadId, attempt: 1, marker: "reviewer.1/t1-a1" });
    expect(callRows(run.rows(), "reviewer.1").filter((r) => r.type === "step_published")).toHaveLength(1);
    run.fake.answer(b.threadId, '{"n":2}');
    const ex2 = (await run.steps()).find((s) => s.call === "explorer.1");
    if (!ex2) throw new Error("no new explorer attempt");
    const c = run.spawn(ex2, "explorer");
    expect(await run.report(ex2, c.threadId)).toBe("bound");
    run.fake.answer(c.threadId, '{"n":1}');
    expect(await second.done).toEqual({ state: "completed", result: [{ n: 1 }, { n: 2 }] });
  });

  it("a send_input step whose subagent already took it has that turn bound (turn_started) before the interrupt, on disk when the host receives it (S000-105 S000-107)", async () => {
    run = await inProcessRun();
    const r = run;
    let onDiskAtInterrupt: JournalRow[] = [];
    r.fake.onRequest((method) => {
      if (method === "turn/interrupt") onDiskAtInterrupt = readJournalFile(r.paths.journal).rows;
    });
    const { done } = run.background(two);
    const steps = await run.steps(2);
    const ex = steps.find((s) => s.call === "explorer.1");
    const rv = steps.find((s) => s.call === "reviewer.1");
    if (!ex || !rv) throw new Error("steps");
    const a = run.spawn(ex, "explorer");
    const b = run.spawn(rv, "reviewer");
    expect(await run.report(ex, a.threadId)).toBe("bound");
    expect(await run.report(rv, b.threadId)).toBe("bound");
    run.fake.answer(a.threadId, "not json");
    const repair = (await run.steps()).find((s) => s.call === "explorer.1" && s.k === 2);
    if (!repair) throw new Error("no repair step");
    expect(repair.action).toBe("send_input");
    const turn2 = run.fake.sendInput(a.threadId, repair.message); // taken, never reported
    run.fake.failTurn(b.threadId, "usageLimitExceeded");
    expect(await done).toMatchObject({ state: "paused", reason: "usage_limit" });
    const rows = callRows(run.rows(), "explorer.1");
    const types = rows.map((r) => r.type);
    expect(types.slice(-3)).toEqual(["turn_started", "interrupt_requested", "held"]);
    expect(rows.at(-3)).toMatchObject({ k: 2, turn_id: turn2 });
    expect(rows.at(-2)).toMatchObject({ k: 2, turn_id: turn2, reason: "usage_limit" });
    expect(run.fake.state.turn(a.threadId, turn2).status).toBe("interrupted");
    // the turn_started the stop wrote for that turn, and the interrupt's row, were on disk first
    expect(
      callRows(onDiskAtInterrupt, "explorer.1")
        .slice(-2)
        .map((x) => [x.type, (x as { turn_id?: string }).turn_id]),
    ).toEqual([
      ["turn_started", turn2],
      ["interrupt_requested", turn2],
    ]);
  });
});

describe("run process settings", () => {
  it("with no LostAfter in the spec, an unloaded subagent's unchanged turn is lost after ten minutes, not before (S000-127)", async () => {
    run = await inProcessRun();
    const r = run;
    delete r.spec.lost_after_ms;
    const lost = () => r.rows().filter((x) => x.type === "session_attempt_lost");
    // the clock the loss rules read is moved by hand; the run's polls and naps keep real time
    vi.useFakeTimers({ toFake: ["Date"], shouldAdvanceTime: true });
    try {
      const { done } = r.background(
        defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role: "explorer", task: "a", schema }) }),
      );
      const s = await r.firstStep();
      const a = r.spawn(s, "explorer");
      expect(await r.report(s, a.threadId)).toBe("bound");
      r.fake.setThreadStatus(a.threadId, "notLoaded");
      await new Promise((x) => setTimeout(x, 300));
      vi.setSystemTime(Date.now() + 590_000);
      await new Promise((x) => setTimeout(x, 300));
      expect(lost(), "lost before ten minutes").toEqual([]);
      vi.setSystemTime(Date.now() + 15_000);
      const deadline = performance.now() + 5_000;
      while (lost().length === 0 && performance.now() < deadline) await new Promise((x) => setTimeout(x, 20));
      expect(lost()).toEqual([expect.objectContaining({ reason: "no change for 600000 ms" })]);
      void done.catch(() => {});
    } finally {
      vi.useRealTimers();
    }
  });

  /** holdRun of an ended run with `env` recorded, from a caller whose TMPDIR is /caller/tmp. */
  async function holdEnded(options: {
    token?: string;
    prepare?: (r: InProcessRun) => void;
    log: (l: Record<string, unknown>) => void;
  }) {
    const { holdRun, JournalWriter } = await import("@crw/flow");
    const { mkdtempSync } = await import("node:fs");
    const { join } = await import("node:path");
    run = await inProcessRun();
    const recorded = mkdtempSync(join(run.root, "recorded-"));
    const w = JournalWriter.create(run.paths.journal, run.spec.run_id);
    w.append([{ type: "run_ended", status: "completed", result: 1 }]);
    w.close();
    options.prepare?.(run);
    const saved = process.env.TMPDIR;
    process.env.TMPDIR = "/caller/tmp";
    try {
      const code = await holdRun({
        paths: run.paths,
        spec: { ...run.spec, env: { TMPDIR: recorded } },
        host: run.host,
        ...(options.token && { token: options.token }),
        log: options.log,
      });
      return { code, recorded, after: process.env.TMPDIR };
    } finally {
      if (saved === undefined) delete process.env.TMPDIR;
      else process.env.TMPDIR = saved;
    }
  }

  it("an in-process run puts back what the environment held when it is done (S000-249)", async () => {
    let during: string | undefined;
    const { code, recorded, after } = await holdEnded({
      log: () => {
        during ??= process.env.TMPDIR;
      },
    });
    expect(code).toBe(0);
    expect(during).toBe(recorded);
    expect(after).toBe("/caller/tmp");
  });

  it("an in-process run has the spec's TMPDIR in its environment before it takes its first lock (S000-248)", async () => {
    const { writeFileSync } = await import("node:fs");
    const { join } = await import("node:path");
    const seen: Array<{ msg: string; tmpdir: string | undefined }> = [];
    // Another live process (pid 1) holds the process lock this run tries first: the run says so at once,
    // before it tries the run lock, and that moment shows the environment the first lock was tried in.
    const token = "beefbeefbeef";
    const { recorded } = await holdEnded({
      token,
      prepare: (r) =>
        writeFileSync(join(r.paths.dir, `process.${token}.lock`), JSON.stringify({ pid: 1, token })),
      log: (l) => seen.push({ msg: String(l.msg), tmpdir: process.env.TMPDIR }),
    });
    expect(seen[0]).toEqual({
      msg: "process lock not taken; the started row names no process",
      tmpdir: recorded,
    });
  });
});

describe("the process lock", () => {
  it("a process lock that cannot be taken is warned about; the run goes on with a started row naming no process (S000-267)", async () => {
    const { holdRun } = await import("@crw/flow");
    const { writeFileSync } = await import("node:fs");
    const { join } = await import("node:path");
    run = await inProcessRun();
    const wf = join(run.root, "nothing.mjs");
    writeFileSync(wf, 'export default { name: "nothing", run: async () => "done" };');
    // another live process (pid 1) holds the lock file this process would take
    writeFileSync(
      join(run.paths.dir, "process.cafecafecafe.lock"),
      JSON.stringify({ pid: 1, token: "cafecafecafe" }),
    );
    const lines: Array<Record<string, unknown>> = [];
    const code = await holdRun({
      paths: run.paths,
      spec: { ...run.spec, workflow: wf },
      host: run.host,
      token: "cafecafecafe",
      log: (l) => lines.push(l),
    });
    expect(code).toBe(0);
    expect(lines.some((l) => String(l.msg).includes("process lock not taken"))).toBe(true);
    expect(run.rows().find((r) => r.type === "started")).toMatchObject({ process: null });
    expect(run.rows().at(-1)).toMatchObject({ type: "run_ended", status: "completed", result: "done" });
  });
});
