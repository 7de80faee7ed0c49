import { existsSync } from "node:fs";
import type { JournalRow } from "@crw/flow";
import { checkResumedRun, faultPointsOf } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CrashHarness, type CrashOutcome, rowsOf, tokensByCall } from "./helpers/crashRun.js";

/**
 * Crash injection: the run process kills itself (SIGKILL) after each journal boundary of a scripted run
 * in turn; the run is resumed (`crw flow resume --detach`) and must end with the uninterrupted run's
 * result, no call completed twice and no step published twice. Every boundary runs once (three at a time),
 * before the tests; each test then reads the outcomes where its part of the resume was reached: a call
 * whose last row, when the process died, was the row the test is about. CRW_CRASH_ONLY=<point> runs one.
 */
let h: CrashHarness;
let reference: CrashOutcome;
const outcomes: CrashOutcome[] = [];

beforeAll(async () => {
  h = await CrashHarness.start("crw-flow-crash-");
  reference = await h.run(null);
  const only = process.env.CRW_CRASH_ONLY;
  // a wake's rows depend on the owner's timing (a busy owner's wake is recorded only when it goes out):
  // only their first boundary is a point every run reaches
  const timed = /^after:(session_wake|message_delivery):(?!1$)/;
  const all = faultPointsOf(reference.rows).filter((p) => !p.startsWith("after:run_ended") && !timed.test(p));
  expect(all.length).toBeGreaterThan(15);
  const queue = only ? [only] : [...all];
  // three points at a time: each has its own run and owner thread on the shared fake host
  await Promise.all(
    [0, 1, 2].map(async () => {
      for (let p = queue.shift(); p !== undefined; p = queue.shift()) outcomes.push(await h.run(p));
    }),
  );
}, 300_000);

afterAll(async () => {
  await h?.stop();
});

/** Each call whose last row in the killed process's rows is of `type`, with that row. */
function callsLastAt<T extends JournalRow["type"]>(
  type: T,
): Array<{ out: CrashOutcome; row: Extract<JournalRow, { type: T }> }> {
  const found: Array<{ out: CrashOutcome; row: Extract<JournalRow, { type: T }> }> = [];
  for (const out of outcomes) {
    const lastOfCall = new Map<string, JournalRow>();
    for (const r of out.deadRows) if ("call" in r && typeof r.call === "string") lastOfCall.set(r.call, r);
    for (const row of lastOfCall.values())
      if (row.type === type) found.push({ out, row: row as Extract<JournalRow, { type: T }> });
  }
  return found;
}

/** The rows of one call the resumed process wrote. */
const resumedOf = (out: CrashOutcome, call: string) =>
  out.resumedRows.filter((r) => "call" in r && r.call === call);

describe("crash injection at every journal boundary", () => {
  it("the uninterrupted run (the reference) repairs once and ends completed", () => {
    expect(reference.result).toEqual({ a: 7, b: 5, c: 12, base: 1 });
    expect(rowsOf(reference.rows, "evidence_placed")).toHaveLength(1);
    expect(existsSync(reference.record)).toBe(false);
    expect(rowsOf(reference.rows, "step_published")).toHaveLength(4);
    expect(reference.branch).toMatchObject({ commits: 1, files: "README.md\nsum.txt" });
  });

  it("a SIGKILL after any row resumes to the same result: nothing completed, published or ended twice, the branch committed once", () => {
    expect(outcomes.length).toBeGreaterThan(process.env.CRW_CRASH_ONLY ? 0 : 15);
    for (const out of outcomes) {
      const point = out.point;
      expect(out.killed, `${point}: the process was not killed`).toBe(true);
      expect(out.result, `${point}`).toEqual(reference.result);
      expect(out.leftSteps, `${point}: a step file was left (not retracted)`).toBe(0);
      expect(existsSync(out.record), `${point}: the evidence record was not released`).toBe(false);
      expect(rowsOf(out.rows, "evidence_placed"), `${point}`).toHaveLength(1);
      expect(out.branch, `${point}`).toEqual(reference.branch);
      expect(rowsOf(out.rows, "commit_intended"), `${point}`).toHaveLength(1);
      expect(checkResumedRun(out.rows), `${point}`).toEqual({
        completedTwice: [],
        publishedTwice: [],
        terminalTwice: [],
      });
      expect(rowsOf(out.rows, "started"), `${point}: ${out.rows.map((r) => r.type).join(" ")}`).toHaveLength(
        2,
      );
    }
  });

  it("evidence_placed names its assignment, cwd, attempt and marker, and is durable before the evidence record is written (S000-169)", () => {
    const killedThere = outcomes.filter((o) => o.point?.startsWith("after:evidence_placed:"));
    expect(killedThere.length).toBeGreaterThan(0);
    for (const out of killedThere) {
      // the process died right after the row was durable (a later row may be written, not yet synced):
      // the record was not there yet
      expect(rowsOf(out.deadRows, "evidence_placed"), `${out.point}`).toHaveLength(1);
      expect(out.atKill?.record, `${out.point}: the record was written before its row`).toBe(false);
      const [placed] = rowsOf(out.rows, "evidence_placed");
      const step = rowsOf(out.rows, "step_published").find((s) => s.call === "executor.1");
      expect(placed).toMatchObject({
        call: "executor.1",
        evidence_assignment: step?.evidence_assignment,
        attempt: 1,
        marker: step?.marker,
      });
      // the evidence cwd is the owner's: the record lives under it
      expect(placed?.evidence_cwd).toBe(h.root);
      expect(placed?.evidence_assignment).toMatch(/\S/);
    }
  });

  it("a step's row is durable before its packet and step file are written (S000-024)", () => {
    const killedThere = outcomes.filter((o) => o.point?.startsWith("after:step_published:"));
    expect(killedThere.length).toBeGreaterThan(0);
    let seen = 0;
    for (const out of killedThere) {
      const last = out.atKill?.last;
      // the process died right after the row's write: when no later row followed, nothing of its files
      if (last?.type !== "step_published") continue;
      seen++;
      expect(out.atKill?.packets[last.marker], `${out.point}: the packet was written before its row`).toBe(
        false,
      );
      expect(
        out.atKill?.steps.map((st) => st.marker),
        `${out.point}`,
      ).not.toContain(last.marker);
    }
    expect(seen).toBeGreaterThan(0);
  });

  it("a recovered repair turn counts only the tokens it adds: it starts from its step row's tokens_seen and call_tokens (S000-097)", () => {
    const repairOf = (rows: readonly JournalRow[]) =>
      rowsOf(rows, "step_published").find((s) => s.call === "explorer.1" && s.action === "send_input");
    const referenceRepair = repairOf(reference.rows);
    expect(referenceRepair?.tokens_seen).toBeDefined();
    expect(referenceRepair?.call_tokens).toBeDefined();
    // the explorer's two turns cost 30 + 3 and 20 + 2 (behave): the call counts each turn once
    expect(tokensByCall(reference.rows)["explorer.1"]).toEqual({ input: 50, output: 5, total: 55 });
    // the killed process published the repair and did not harvest it: the resumed one did
    const recovered = outcomes.filter(
      (o) => repairOf(o.deadRows) && !rowsOf(o.deadRows, "completed").some((c) => c.call === "explorer.1"),
    );
    expect(recovered.length).toBeGreaterThan(0);
    for (const out of recovered) {
      const repair = repairOf(out.rows);
      expect(repair?.tokens_seen, `${out.point}`).toEqual(referenceRepair?.tokens_seen);
      expect(repair?.call_tokens, `${out.point}`).toEqual(referenceRepair?.call_tokens);
      expect(tokensByCall(out.rows)["explorer.1"], `${out.point}`).toEqual(
        tokensByCall(reference.rows)["explorer.1"],
      );
    }
  });

  it("a call whose last row was prepared is resumed by publishing its first step in the directory the dead process allocated (S000-137)", () => {
    const found = callsLastAt("prepared");
    expect(found.length).toBeGreaterThan(0);
    for (const { out, row } of found) {
      const next = resumedOf(out, row.call);
      expect(next[0], `${out.point} ${row.call}`).toMatchObject({
        type: "step_published",
        k: 1,
        attempt: 1,
        workspace: row.allocation.workspace,
      });
      expect(
        next.filter((r) => r.type === "prepared"),
        `${out.point}`,
      ).toEqual([]);
    }
  });

  it("no step reaches the host twice: each marker is one subagent turn, the repair's included (S000-140)", () => {
    const markersOf = (out: CrashOutcome) => out.host.subagents.flatMap((s) => s.markers);
    const referenceMarkers = markersOf(reference).sort();
    expect(referenceMarkers).toHaveLength(4);
    // the runs killed right after the repair's row, before anything answered it: the resume decided on it
    const atRepair = callsLastAt("step_published").filter(({ row }) => row.action === "send_input");
    expect(atRepair.length).toBeGreaterThan(0);
    for (const { out, row } of atRepair) {
      const carrying = markersOf(out).filter((m) => m === row.marker);
      expect(carrying, `${out.point}: the repair's turns`).toHaveLength(1);
      expect(
        rowsOf(resumedOf(out, row.call), "step_published"),
        `${out.point}: the repair published again`,
      ).toEqual([]);
    }
    for (const out of outcomes) {
      const markers = markersOf(out);
      expect(new Set(markers).size, `${out.point}: ${markers.join(" ")}`).toBe(markers.length);
      expect(markers, `${out.point}`).toHaveLength(4);
      expect(out.host.subagents, `${out.point}: a subagent spawned twice`).toHaveLength(3);
    }
  });

  it("a call whose last row was turn_started has the step file the dead process left retracted (S000-146)", () => {
    const found = callsLastAt("turn_started").filter(({ out, row }) =>
      out.atKill?.steps.some((s) => s.marker === row.marker),
    );
    expect(found.length).toBeGreaterThan(0);
    for (const { out } of found) expect(out.leftSteps, `${out.point}`).toBe(0);
  });

  it("a call whose last row was turn_started and whose turn completed is harvested: no turn started again (S000-147)", () => {
    const found = callsLastAt("turn_started");
    expect(found.length).toBeGreaterThan(0);
    for (const { out, row } of found) {
      const next = resumedOf(out, row.call);
      expect(
        next.filter((r) => r.type === "turn_started" && r.k === row.k),
        `${out.point}`,
      ).toEqual([]);
      // its next row is the harvest: the answer, the executor's commit intent before its answer, or, for
      // the explorer's invalid answer, the repair step
      expect(next[0]?.type, `${out.point} ${row.call}`).toMatch(
        /^(completed|commit_intended|step_published)$/,
      );
      if (next[0]?.type === "step_published") expect(next[0]).toMatchObject({ k: row.k + 1 });
    }
  });
});

describe("a resume takes its session from the run's record", () => {
  it("the resumed process reaches the recorded host and binds subagents of the recorded owner, whatever its own environment names (S000-233)", async () => {
    // the resuming shell names another host and another owner thread: the record's are the run's
    const elsewhere = h.fake.createOwnerThread({ cwd: h.root });
    const out = await h.run("after:step_published:1", {
      resumeEnv: { CRW_FLOW_HOST: "ws://127.0.0.1:9", CODEX_THREAD_ID: elsewhere },
    });
    expect(out.killed).toBe(true);
    // the run ended through the resumed process: its steps reached the owner by the run's step files
    expect(out.result).toEqual(reference.result);
    expect(rowsOf(out.resumedRows, "started")[0]).toMatchObject({ backend: "session", process_n: 2 });
    const bound = rowsOf(out.resumedRows, "thread_started");
    expect(bound.length).toBeGreaterThan(0);
    for (const t of bound) expect(t.parent_thread_id).toBe(out.owner);
    expect(out.host.subagents.length).toBeGreaterThanOrEqual(bound.length);
  }, 60_000);
});
