import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type FlowError,
  faultKey,
  JournalWriter,
  parseFaultPoint,
  parseJournal,
  readJournalFile,
  runSpent,
  startedBackend,
  tokenTotal,
} from "@crw/flow";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";

let dir: string | null = null;
afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = null;
});

function fresh(): string {
  dir = mkdtempSync(join(tmpdir(), "crw-journal-"));
  return join(dir, "journal.jsonl");
}

const started = {
  type: "started" as const,
  backend: "session" as const,
  role_pairs: {},
  policy_digest: "sha256:x",
  process: null,
  pid: 1,
  process_n: 1,
};

describe("the journal", () => {
  it("has a version header and validated rows with seq and at", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    w.append([started]);
    w.append([{ type: "run_paused", reason: "usage_limit" }]);
    w.close();
    const read = readJournalFile(path);
    expect(read.header).toMatchObject({ format: "crw-flow-journal", version: 1, run_id: "r1" });
    expect(read.rows.map((r) => [r.type, r.seq])).toEqual([
      ["started", 0],
      ["run_paused", 1],
    ]);
    expect(read.torn).toBeNull();
  });

  it("counts one fsync per batch and refuses an invalid row before writing anything", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    w.append([started, { type: "run_paused", reason: "x" }]);
    expect(w.stats).toMatchObject({ batches: 1, rows: 2, fsyncs: 1 });
    const before = readFileSync(path, "utf8");
    expect(() => w.append([{ type: "run_paused" } as never])).toThrow();
    expect(readFileSync(path, "utf8")).toBe(before);
    w.close();
  });

  it("ignores and reports a torn last line; a writer that opens it cuts it off and appends after it", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    w.append([started]);
    w.close();
    writeFileSync(path, `${readFileSync(path, "utf8")}{"seq":1,"at":"x","type":"run_pa`);
    const read = readJournalFile(path);
    expect(read.rows).toHaveLength(1);
    expect(read.torn).toMatchObject({ bytes: 32 });
    const { writer, read: r2 } = JournalWriter.open(path);
    expect(r2.torn).not.toBeNull();
    writer.append([{ type: "run_paused", reason: "y" }]);
    writer.close();
    expect(readJournalFile(path).rows.map((r) => r.type)).toEqual(["started", "run_paused"]);
  });

  it("treats a bad line in the middle as corruption naming the line, never skipping it", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    w.append([started]);
    w.append([{ type: "run_paused", reason: "y" }]);
    w.close();
    const lines = readFileSync(path, "utf8").split("\n");
    lines[1] = '{"not":"a row"}';
    writeFileSync(path, lines.join("\n"));
    expect(() => readJournalFile(path)).toThrow(/line 2 is not a valid row/);
    try {
      readJournalFile(path);
    } catch (e) {
      expect((e as FlowError).code).toBe("journal_corrupt");
    }
  });

  it("a started row without backend reads as an App Server run (S000-006 S000-005)", () => {
    const { backend: _b, ...legacy } = started;
    const text = `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r", created_at: "t" })}\n${JSON.stringify({ ...legacy, seq: 0, at: "t" })}\n`;
    const read = parseJournal(text);
    expect(startedBackend(read.rows)).toBe("app-server");
    expect(startedBackend([{ ...started, seq: 0, at: "t" }])).toBe("session");
    expect(startedBackend([])).toBeNull();
  });

  /** A journal's text: the header, then `rows` numbered from 0. */
  const journalText = (rows: object[]) =>
    `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r", created_at: "t" })}\n${rows
      .map((r, i) => JSON.stringify({ ...r, seq: i, at: "t" }))
      .join("\n")}\n`;
  const completedRow = (call: string, tokens: object) => ({
    type: "completed",
    call,
    op: call,
    k: 1,
    attempt: 1,
    result: {},
    result_digest: "d",
    raw_text: "{}",
    extracted: false,
    tokens,
  });

  it("an older journal's role_store_changed row still reads, with its two digests (S000-175)", () => {
    const read = parseJournal(
      journalText([{ type: "role_store_changed", pinned_digest: "sha256:a", store_digest: "sha256:b" }]),
    );
    expect(read.rows[0]).toMatchObject({
      type: "role_store_changed",
      pinned_digest: "sha256:a",
      store_digest: "sha256:b",
    });
  });

  it("a terminal row written before its token parts existed reads them as 0 in the run's figures (S000-096)", () => {
    const read = parseJournal(
      journalText([
        completedRow("old.1", {}),
        completedRow("new.1", { input: 10, cached_input: 4, output: 3, reasoning_output: 1, total: 13 }),
      ]),
    );
    expect(read.rows.map((r) => r.type)).toEqual(["completed", "completed"]);
    const old = read.rows[0];
    if (old?.type !== "completed") throw new Error("row");
    // the old row adds nothing to any part of the run's spend, and its own total is 0
    expect(runSpent(read.rows)).toEqual({
      input: 10,
      cached_input: 4,
      output: 3,
      reasoning_output: 1,
      total: 13,
    });
    expect(tokenTotal(old.tokens)).toBe(0);
    expect(runSpent(read.rows.slice(0, 1))).toEqual({});
  });

  it("reads the flow rows of the rest of the seed (session_wake, escalation, evidence_placed, flow_warning)", () => {
    const rows = [
      {
        type: "session_wake",
        batch: "b1",
        wake_id: "run:r/b1",
        renotify: 0,
        ops: ["c.1/t1"],
        owner: "o",
        owner_status: "idle",
        waiting_seconds: 0,
        staged: true,
      },
      {
        type: "escalation",
        reason: "session_unresponsive",
        owner: "o",
        ops: ["c.1/t1"],
        batch: "b1",
        waiting_seconds: 7200,
      },
      {
        type: "evidence_placed",
        call: "c.1",
        evidence_assignment: "e",
        evidence_cwd: "/w",
        attempt: 1,
        marker: "c.1/t1-a1",
      },
      { type: "flow_warning", warning: "read_role_wrote", call: "c.1" },
    ].map((r, i) => JSON.stringify({ ...r, seq: i, at: "t" }));
    const text = `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r", created_at: "t" })}\n${rows.join("\n")}\n`;
    expect(parseJournal(text).rows.map((r) => r.type)).toEqual([
      "session_wake",
      "escalation",
      "evidence_placed",
      "flow_warning",
    ]);
  });

  it("refuses a journal of a newer version", () => {
    expect(() =>
      parseJournal(
        `${JSON.stringify({ format: "crw-flow-journal", version: 9, run_id: "r", created_at: "t" })}\n`,
      ),
    ).toThrow(/newer/);
  });

  it("property: any text appended after whole lines is either a torn tail or corruption, never a silent skip", () => {
    const header = `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r", created_at: "t" })}\n`;
    const good = `${JSON.stringify({ ...started, seq: 0, at: "t" })}\n`;
    fc.assert(
      fc.property(fc.string({ maxLength: 200 }), fc.boolean(), (junk, newline) => {
        const text = header + good + junk + (newline ? "\n" : "");
        let read: ReturnType<typeof parseJournal> | null = null;
        try {
          read = parseJournal(text);
        } catch (e) {
          expect((e as FlowError).code).toBe("journal_corrupt");
          return;
        }
        expect(read.rows.length).toBeGreaterThanOrEqual(1);
        expect(read.rows[0]?.type).toBe("started");
        if (!newline && junk.length > 0 && !junk.includes("\n")) expect(read.torn).not.toBeNull();
      }),
    );
  });

  it("parses fault points, with or without the action a step row must have", () => {
    expect(parseFaultPoint("after:step_published:2")).toEqual({
      rowType: "step_published",
      action: null,
      n: 2,
    });
    expect(parseFaultPoint("after:step_published/send_input:1")).toEqual({
      rowType: "step_published",
      action: "send_input",
      n: 1,
    });
    expect(parseFaultPoint("after:step_published/:1")).toBeNull();
    expect(parseFaultPoint("before:x:1")).toBeNull();
    expect(parseFaultPoint(undefined)).toBeNull();
  });

  it("a fault point with an action counts only the rows of that type with that action", () => {
    const bySendInput = parseFaultPoint("after:step_published/send_input:1");
    const byType = parseFaultPoint("after:step_published:1");
    if (!bySendInput || !byType) throw new Error("unparsed");
    expect(faultKey(bySendInput, { type: "step_published", action: "spawn" })).toBeNull();
    expect(faultKey(bySendInput, { type: "step_published", action: "send_input" })).toBe(
      "step_published/send_input",
    );
    expect(faultKey(bySendInput, { type: "turn_started" })).toBeNull();
    expect(faultKey(byType, { type: "step_published", action: "spawn" })).toBe("step_published");
    expect(faultKey(byType, { type: "started" })).toBeNull();
  });
});
