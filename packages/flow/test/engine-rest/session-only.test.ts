import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { JournalRow } from "@crw/flow";
import { afterEach, describe, expect, it, onTestFinished } from "vitest";
import { CrashHarness } from "../helpers/crashRun.js";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  rowsOfType as of,
  countSchema as schema,
  until,
} from "../helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

/** The host methods that would start, resume or resend a turn: the App Server path's, never a session call's. */
const TURN_MAKERS = ["thread/start", "thread/fork", "thread/resume", "turn/start", "turn/steer"];

describe("a session call on its own path", () => {
  it("no App Server reconcile, no live resend, no worktree retirement: one allocation serves every attempt, and the engine starts no thread or turn (S000-136)", async () => {
    // How the engine guarantees it: a session call moves only through the SessionHost reads
    // (thread/read, thread/list), turn/interrupt and the owner's step files; the call's turns are the
    // owner's spawn_agent / send_input. Its allocation is the prepared row's, made once after that row,
    // and a lost attempt's next step is published in it (callFold: the next attempt of the same call).
    run = await inProcessRun({ lostAfterMs: 200 });
    const one = defineWorkflow({
      name: "one",
      run: (ctx) => ctx.call({ role: "executor", task: "build it", schema }),
    });
    const { done } = run.background(one);
    const s1 = await run.firstStep();
    const a = run.spawn(s1, "executor");
    expect(await run.report(s1, a.threadId)).toBe("bound");
    // the first attempt leaves work in P, then its thread is gone from the host
    writeFileSync(join(s1.workspace, "work-of-attempt-1.txt"), "half done\n");
    run.fake.setThreadStatus(a.threadId, "notLoaded");
    await until("the lost attempt", () => of(run?.rows() ?? [], "session_attempt_lost").length === 1);
    await until("attempt 2", () => of(run?.rows() ?? [], "step_published").length === 2);
    const s2 = (await run.steps()).find((x) => x.attempt === 2);
    if (!s2) throw new Error("no attempt 2");
    // the next attempt runs in the same P, with the earlier attempt's work still there (nothing retired)
    expect(s2.workspace).toBe(s1.workspace);
    expect(readFileSync(join(s2.workspace, "work-of-attempt-1.txt"), "utf8")).toBe("half done\n");
    expect(readFileSync(s2.packet, "utf8")).toContain("cut off");
    const b = run.spawn(s2, "executor");
    expect(await run.report(s2, b.threadId)).toBe("bound");
    run.fake.answer(b.threadId, '{"n":2}');
    expect(await done).toEqual({ state: "completed", result: { n: 2 } });

    const rows = run.rows();
    const prepared = of(rows, "prepared");
    expect(prepared).toHaveLength(1); // one allocation, never prepared again
    const allocation = (prepared[0] as Extract<JournalRow, { type: "prepared" }>).allocation;
    for (const step of of(rows, "step_published")) {
      expect((step as Extract<JournalRow, { type: "step_published" }>).workspace).toBe(allocation.workspace);
    }
    expect(existsSync(join(allocation.workspace, "work-of-attempt-1.txt"))).toBe(true);
    // the engine read the host and never started, forked, resumed or resent a turn on it
    const methods = run.fake.requests.map((r) => r.method);
    expect(methods).toContain("thread/read");
    expect(methods.filter((m) => TURN_MAKERS.includes(m))).toEqual([]);
  });

  it("a resumed session run adopts its bound subagent with no App Server reconcile or resend: no thread started, forked or resumed, no turn started or steered on a subagent (S000-136)", async () => {
    const h = await CrashHarness.start("crw-flow-session-only-");
    onTestFinished(() => h.stop());
    // the run's process is SIGKILLed right after its first bind; the resumed process goes on with it
    const out = await h.run("after:turn_started:1");
    expect(out.killed).toBe(true);
    expect(out.result).toEqual({ a: 7, b: 5, c: 12, base: 1 });
    const subagents = new Set(out.host.subagents.map((a) => a.id));
    const made = h.fake.requests.filter(
      (r) =>
        TURN_MAKERS.includes(r.method) &&
        (r.method.startsWith("thread/") ||
          subagents.has(String((r.params as { threadId?: unknown }).threadId))),
    );
    expect(made.map((r) => r.method)).toEqual([]);
  });
});
