import { readFileSync, writeFileSync } from "node:fs";
import {
  type JournalRow,
  readJournalFile,
  reportName,
  sendInputMessage,
  spawnMessage,
  writeReport,
} from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import type { Behave, OwnerStep } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { behave, CrashHarness, type CrashOutcome, rowsOf, type WhileDead } from "./helpers/crashRun.js";

/**
 * The resume of a call whose process was SIGKILLed in the middle of a step, one branch at a time: what the
 * owner and the host did while the process was dead is made by the test (a subagent spawned for the
 * step, a dispatch report, a turn sent, a torn bind batch, a thread the host unloaded), then the run is
 * resumed and must end with the uninterrupted run's result.
 */
let h: CrashHarness;
let reference: CrashOutcome;

beforeAll(async () => {
  h = await CrashHarness.start("crw-flow-crash-resume-");
  reference = await h.run(null);
}, 120_000);

afterAll(async () => {
  await h?.stop();
});

type Step = Extract<JournalRow, { type: "step_published" }>;

/** The step_published row the kill came after: the last one the dead process wrote. */
/**
 * The step the fault point killed after: the first step_published (of `action`, when given) the dead process
 * wrote. Not the last row of its kind: a row written after it, still waiting for its fsync at the kill, can
 * be in the file too.
 */
function killedStep(rows: readonly JournalRow[], action?: Step["action"]): Step {
  const step = rowsOf(rows, "step_published").find((s) => action === undefined || s.action === action);
  if (!step) throw new Error(`the dead process published no ${action ?? ""} step`);
  return step;
}

/** A subagent spawned for a step as the owner's spawn_agent does it, with the step's own message. */
function spawnFor(fake: FakeAppServer, owner: string, step: Step): string {
  return fake.spawnSubagent({
    ownerThreadId: owner,
    message: spawnMessage(step.marker, step.role, step.workspace, step.packet),
    model: step.model,
    reasoningEffort: step.effort,
    agentRole: step.agent_type,
  }).threadId;
}

/** Ends a subagent's turn with the answer the scripted subagents give for that step. */
async function answer(
  fake: FakeAppServer,
  threadId: string,
  step: { call: string; k: number },
): Promise<void> {
  const turn = await behave({ call: step.call, k: step.k } as OwnerStep, threadId);
  if (turn.kind !== "answer") throw new Error("the scripted subagent does not answer");
  fake.completeTurn(threadId, {
    messages: turn.messages.map((m) => ({ text: m.text, phase: m.phase ?? null })),
    ...(turn.usage ? { usage: turn.usage } : {}),
  });
}

const threadOf = (out: CrashOutcome, call: string) =>
  rowsOf(out.rows, "thread_started").filter((t) => t.call === call);

function expectSameEnd(out: CrashOutcome): void {
  expect(out.killed).toBe(true);
  expect(out.result).toEqual(reference.result);
  expect(out.leftSteps).toBe(0);
  expect(out.branch).toEqual(reference.branch);
}

/** The step_published point of the explorer's repair (a send_input step), from the reference's rows. */
/** Right after the repair's step is published: the first send_input step, wherever parallel calls put it. */
function repairPoint(): string {
  expect(rowsOf(reference.rows, "step_published").some((s) => s.action === "send_input")).toBe(true);
  return "after:step_published/send_input:1";
}

describe.concurrent("resume of a call whose last row is step_published", { timeout: 60_000 }, () => {
  it("answers the dispatch report waiting in the inbox first: the reported subagent is bound, not the other one the host shows (S000-138)", async () => {
    let reported = "";
    let other = "";
    let name = "";
    const whileDead: WhileDead = async ({ fake, owner, paths, rows }) => {
      const step = killedStep(rows);
      // two subagents carry the step's marker; the owner reported the second one
      other = spawnFor(fake, owner, step);
      reported = spawnFor(fake, owner, step);
      await answer(fake, reported, step);
      name = reportName(step.call, step.k, step.attempt, reported);
      writeReport(paths.inbox, {
        format: "crw-flow-dispatch/1",
        run_id: paths.runId,
        call: step.call,
        k: step.k,
        attempt: step.attempt,
        agent_id: reported,
        at: new Date().toISOString(),
      });
    };
    const out = await h.run("after:step_published:1", { whileDead });
    expectSameEnd(out);
    expect(out.atKill?.unanswered).toEqual([]);
    expect(out.replies[name]).toBe("bound");
    const call = threadOf(out, killedStep(out.deadRows).call);
    expect(call.map((t) => t.thread_id)).toEqual([reported]);
    expect(call.map((t) => t.thread_id)).not.toContain(other);
  });

  it("looks a spawned step up on the host by its marker and binds the subagent it finds, with no second spawn (S000-139)", async () => {
    let found = "";
    let marker = "";
    const whileDead: WhileDead = async ({ fake, owner, rows }) => {
      const step = killedStep(rows);
      marker = step.marker;
      found = spawnFor(fake, owner, step);
      await answer(fake, found, step);
    };
    const out = await h.run("after:step_published:1", { whileDead });
    expectSameEnd(out);
    const step = killedStep(out.deadRows);
    expect(threadOf(out, step.call).map((t) => t.thread_id)).toEqual([found]);
    const carrying = out.host.subagents.filter((s) => s.markers.includes(marker));
    expect(carrying.map((s) => s.id)).toEqual([found]);
  });

  it("looks a send_input step up as the marker turn on its subagent and binds that turn: the repair the owner sent is never sent again (S000-139 S000-140)", async () => {
    let turnId = "";
    let thread = "";
    let marker = "";
    const whileDead: WhileDead = async ({ fake, rows }) => {
      const step = killedStep(rows, "send_input");
      thread = step.agent_id as string;
      marker = step.marker;
      turnId = fake.sendInput(thread, sendInputMessage(step.marker, step.input));
      await answer(fake, thread, step);
    };
    const out = await h.run(repairPoint(), { whileDead });
    expectSameEnd(out);
    const repair = rowsOf(out.resumedRows, "turn_started").filter(
      (t) => t.call === "explorer.1" && t.k === 2,
    );
    expect(repair.map((t) => t.turn_id)).toEqual([turnId]);
    const explorer = out.host.subagents.find((s) => s.id === thread);
    expect(explorer?.markers).toHaveLength(2);
    expect(out.host.subagents.flatMap((s) => s.markers).filter((m) => m === marker)).toHaveLength(1);
  });

  it("publishes the same step again when the host shows nothing for it: one subagent, spawned after the resume (S000-141)", async () => {
    let marker = "";
    const whileDead: WhileDead = ({ rows }) => {
      marker = killedStep(rows).marker;
    };
    const out = await h.run("after:step_published:1", { whileDead });
    expectSameEnd(out);
    // at the kill no step file and no subagent carried the marker
    expect(out.atKill?.steps.map((s) => s.marker)).not.toContain(marker);
    expect(out.atKill?.host.subagents.flatMap((s) => s.markers)).not.toContain(marker);
    const carrying = out.host.subagents.filter((s) => s.markers.includes(marker));
    expect(carrying).toHaveLength(1);
    // the same step: its row is the dead process's, published again by its files only
    expect(rowsOf(out.rows, "step_published").filter((s) => s.marker === marker)).toHaveLength(1);
    const step = rowsOf(out.rows, "step_published").find((s) => s.marker === marker) as Step;
    expect(threadOf(out, step.call).map((t) => t.thread_id)).toEqual([carrying[0]?.id]);
  });
});

describe.concurrent("resume of a call whose last row is thread_started (a bind batch torn after its first row)", {
  timeout: 60_000,
}, () => {
  // the executor's bind: the only call running then, so its batch is the journal's last write
  const executorBind = () => {
    const n = rowsOf(reference.rows, "turn_started").findIndex((t) => t.call === "executor.1") + 1;
    expect(n).toBeGreaterThan(0);
    return `after:turn_started:${n}`;
  };

  it("adopts the named subagent and writes only its turn_started: nothing spawned or published again (S000-142)", async () => {
    const { whileDead, torn } = tearBindBatch();
    const out = await h.run(executorBind(), { whileDead });
    expectSameEnd(out);
    const call = torn.call;
    const resumed = out.resumedRows.filter((r) => "call" in r && r.call === call);
    expect(resumed[0]).toMatchObject({ type: "turn_started", k: 1, turn_id: torn.turnId });
    expect(resumed.filter((r) => r.type === "thread_started" || r.type === "step_published")).toEqual(
      resumed.filter((r) => r.type === "step_published" && r.k > 1),
    );
    expect(out.host.subagents).toHaveLength(3);
  });

  it("after adopting, reads the subagent as after turn_started: its finished turn is harvested (S000-145)", async () => {
    const { whileDead, torn } = tearBindBatch();
    const out = await h.run(executorBind(), { whileDead });
    expectSameEnd(out);
    const resumed = out.resumedRows.filter((r) => "call" in r && r.call === torn.call);
    // the executor's harvest: its commit intent, then its answer
    expect(resumed.map((r) => r.type).slice(0, 3)).toEqual(["turn_started", "commit_intended", "completed"]);
  });
});

/**
 * Cuts the journal's last row when it is a turn_started: what a write torn after the batch's first row
 * leaves. `torn` is the call whose batch it cut, and that call's turn.
 */
function tearBindBatch(): { whileDead: WhileDead; torn: { call: string; turnId: string } } {
  const torn = { call: "", turnId: "" };
  const whileDead: WhileDead = ({ paths }) => {
    const text = readFileSync(paths.journal, "utf8");
    const lines = text.split("\n").filter((l) => l !== "");
    const last = JSON.parse(lines.at(-1) as string) as JournalRow;
    const before = JSON.parse(lines.at(-2) as string) as JournalRow;
    if (last.type !== "turn_started" || before.type !== "thread_started" || before.call !== last.call)
      throw new Error(`the journal does not end with a bind batch: ${before.type} ${last.type}`);
    torn.call = last.call;
    torn.turnId = last.turn_id;
    writeFileSync(paths.journal, `${lines.slice(0, -1).join("\n")}\n`);
  };
  return { whileDead, torn };
}

describe.concurrent("resume of a call whose last row is turn_started", { timeout: 60_000 }, () => {
  /**
   * The first turns of the explorer and the reviewer stay running until the gate opens: then each running
   * first turn is answered as the scripted subagents answer it, and later turns are answered at once.
   */
  function firstTurnsHeld(fake: FakeAppServer, owner: () => string, keep = new Set<string>()) {
    let open = false;
    const held: Behave = (step, agentId) =>
      !open && step.k === 1 && step.attempt === 1 && step.call !== "executor.1"
        ? { kind: "hang" }
        : behave(step, agentId);
    const release = async () => {
      open = true;
      for (const t of fake.state.threads.values()) {
        if (t.thread.parentThreadId !== owner() || keep.has(t.thread.id)) continue;
        if (t.turns.at(-1)?.status !== "inProgress") continue;
        // the spawn message names the role: the call is its first
        const role = /CRW-ROLE: (\S+)/.exec(t.thread.preview)?.[1];
        await answer(fake, t.thread.id, { call: `${role}.1`, k: 1 });
      }
    };
    return { held, release };
  }

  it("waits for a turn still running: it is harvested once it ends, on the same attempt (S000-147)", async () => {
    let owner = "";
    const gate = firstTurnsHeld(h.fake, () => owner);
    let endedAt = 0;
    const whileDead: WhileDead = (dead) => {
      owner = dead.owner;
      setTimeout(() => {
        endedAt = Date.now();
        void gate.release();
      }, 1_500);
    };
    const out = await h.run("after:turn_started:1", { whileDead, behave: gate.held });
    expectSameEnd(out);
    // the call bound at the kill ran on past the resume; its answer came after the test ended its turn
    const first = rowsOf(out.deadRows, "turn_started")[0] as Extract<JournalRow, { type: "turn_started" }>;
    expect(rowsOf(out.rows, "session_attempt_lost")).toEqual([]);
    const harvest = out.resumedRows.find(
      (r) => "call" in r && r.call === first.call && (r.type === "completed" || r.type === "step_published"),
    );
    expect(harvest).toBeDefined();
    expect(Date.parse(harvest?.at as string)).toBeGreaterThanOrEqual(endedAt - 5);
    expect(rowsOf(out.rows, "completed").find((c) => c.call === first.call)?.attempt).toBe(1);
  });

  it("loses a turn whose thread the host no longer holds: the next attempt runs in the same allocation (S000-147)", async () => {
    let owner = "";
    const lostThreads = new Set<string>();
    const gate = firstTurnsHeld(h.fake, () => owner, lostThreads);
    const whileDead: WhileDead = ({ fake, rows, owner: o, paths }) => {
      owner = o;
      const first = rowsOf(rows, "thread_started")[0];
      lostThreads.add(first?.thread_id as string);
      fake.setThreadStatus(first?.thread_id as string, "notLoaded");
      // the other calls' turns end once the resumed process has judged the lost attempt (not after a fixed
      // time, which a loaded machine can outrun)
      void (async () => {
        const deadline = Date.now() + 30_000;
        while (Date.now() < deadline) {
          const journal = readJournalFile(paths.journal);
          if (journal.rows.some((r) => r.type === "session_attempt_lost")) break;
          await new Promise((r) => setTimeout(r, 50));
        }
        await gate.release();
      })();
    };
    const out = await h.run("after:turn_started:1", {
      whileDead,
      behave: gate.held,
      startArgs: ["--lost-after-ms", "1000"],
    });
    expectSameEnd(out);
    const [lostThread] = [...lostThreads];
    const lost = rowsOf(out.resumedRows, "session_attempt_lost");
    expect(lost.map((l) => l.agent_id)).toEqual([lostThread]);
    const call = lost[0]?.call as string;
    const steps = rowsOf(out.rows, "step_published").filter((s) => s.call === call && s.k === 1);
    expect(steps.map((s) => s.attempt)).toEqual([1, 2]);
    expect(new Set(steps.map((s) => s.workspace)).size).toBe(1);
    expect(rowsOf(out.rows, "completed").find((c) => c.call === call)?.attempt).toBe(2);
  });
});
