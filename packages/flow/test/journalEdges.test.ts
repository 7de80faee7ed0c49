import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FlowError, JournalWriter, parseJournal, readJournalFile } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";

let dir: string | null = null;
afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = null;
});

function fresh(): string {
  dir = mkdtempSync(join(tmpdir(), "crw-journal-edges-"));
  return join(dir, "journal.jsonl");
}

const HEADER = `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r", created_at: "t" })}\n`;
const paused = (reason: string) => ({ type: "run_paused" as const, reason });

function thrown(f: () => unknown): FlowError {
  try {
    f();
  } catch (e) {
    if (e instanceof FlowError) return e;
    throw e;
  }
  throw new Error("expected a FlowError");
}

describe("reading a journal: the header and the lines", () => {
  it("refuses an empty journal and one whose only text is a torn line: there is no header", () => {
    for (const text of ["", '{"format":"crw-flow-jour']) {
      const e = thrown(() => parseJournal(text, "j.jsonl"));
      expect(e.code).toBe("journal_corrupt");
      expect(e.message).toBe("j.jsonl: no header line");
    }
  });

  it('names the text "journal" in its errors when it is given no source', () => {
    expect(() => parseJournal("")).toThrow(/^journal: no header line$/);
  });

  it("refuses a first line that is not a journal header, naming the source and line 1", () => {
    for (const first of ["not json", '{"format":"other","version":1,"run_id":"r","created_at":"t"}']) {
      const e = thrown(() => parseJournal(`${first}\n`, "j.jsonl"));
      expect(e.code).toBe("journal_corrupt");
      expect(e.message).toBe("j.jsonl: line 1 is not a journal header");
    }
  });

  it("reads a journal of its own version and refuses a newer one with journal_version", () => {
    expect(parseJournal(HEADER).rows).toEqual([]);
    const e = thrown(() => parseJournal(HEADER.replace('"version":1', '"version":2'), "j"));
    expect(e.code).toBe("journal_version");
    expect(e.message).toContain("journal version 2 is newer than this crw reads (1)");
  });

  it("names the bad line by its line number in the file, with the reason, and carries it as context", () => {
    const good = `${JSON.stringify({ ...paused("a"), seq: 0, at: "t" })}\n`;
    const e = thrown(() => parseJournal(`${HEADER}${good}${good}{"seq":2}\n${good}`, "j.jsonl"));
    expect(e.code).toBe("journal_corrupt");
    expect(e.message).toMatch(/^j\.jsonl: line 4 is not a valid row \(.+\)$/);
    expect(e.message).not.toContain("(invalid)");
    expect(e.context).toEqual({ line: 4 });
    const bad = thrown(() => parseJournal(`${HEADER}{{{\n`, "j"));
    expect(bad.message).toMatch(/line 2 is not a valid row/);
  });

  it("reports a torn tail at the byte offset where the whole lines end, counting multi-byte text", () => {
    const row = `${JSON.stringify({ ...paused("ünïcödé"), seq: 0, at: "t" })}\n`;
    const tail = '{"seq":1,"reason":"é';
    const read = parseJournal(HEADER + row + tail);
    const whole = Buffer.byteLength(HEADER + row);
    expect(read.validBytes).toBe(whole);
    expect(read.torn).toEqual({ offset: whole, bytes: Buffer.byteLength(tail) });
    expect(read.rows).toHaveLength(1);
    expect(parseJournal(HEADER + row)).toMatchObject({ torn: null, validBytes: whole });
  });

  it("names the file it read in its errors", () => {
    const path = fresh();
    writeFileSync(path, "nope\n");
    expect(() => readJournalFile(path)).toThrow(`${path}: line 1 is not a journal header`);
  });
});

describe("the journal writer", () => {
  it("refuses to create a journal where one exists", () => {
    const path = fresh();
    JournalWriter.create(path, "r1").close();
    const e = thrown(() => JournalWriter.create(path, "r1"));
    expect(e.code).toBe("journal_corrupt");
    expect(e.message).toContain("exists already");
  });

  it("a reopened journal goes on with the next seq, and its rows are the old ones then the new", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    expect(w.append([paused("a"), paused("b")]).map((r) => r.seq)).toEqual([0, 1]);
    w.close();
    const { writer, read } = JournalWriter.open(path);
    expect(read.rows.map((r) => r.seq)).toEqual([0, 1]);
    expect(writer.append([paused("c")]).map((r) => r.seq)).toEqual([2]);
    expect(writer.rows.map((r) => r.seq)).toEqual([0, 1, 2]);
    writer.close();
    expect(readJournalFile(path).rows.map((r) => r.seq)).toEqual([0, 1, 2]);
  });

  it("a reopened journal with a header only starts at seq 0", () => {
    const path = fresh();
    JournalWriter.create(path, "r1").close();
    const { writer } = JournalWriter.open(path);
    expect(writer.append([paused("a")])[0]?.seq).toBe(0);
    writer.close();
  });

  it("opening cuts the torn tail off the file to the whole lines' length before it appends", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    w.append([paused("a")]);
    w.close();
    const whole = statSync(path).size;
    writeFileSync(path, `${readFileSync(path, "utf8")}{"seq":1,"at":"x","ty`);
    const { writer, read } = JournalWriter.open(path);
    expect(read.torn).toMatchObject({ offset: whole });
    expect(statSync(path).size).toBe(whole);
    writer.close();
  });

  it("an empty batch writes nothing and counts nothing", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    const before = readFileSync(path, "utf8");
    expect(w.append([])).toEqual([]);
    expect(w.stats).toEqual({ batches: 0, rows: 0, bytes: 0, fsyncs: 0 });
    expect(readFileSync(path, "utf8")).toBe(before);
    expect(w.append([paused("a")])[0]?.seq).toBe(0);
    w.close();
  });

  it("counts batches, rows, bytes and fsyncs as written, each batch one line per row with one time", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    const size0 = statSync(path).size;
    const rows = w.append([paused("a"), paused("b"), paused("c")]);
    w.append([paused("d")]);
    expect(w.stats).toEqual({ batches: 2, rows: 4, bytes: statSync(path).size - size0, fsyncs: 2 });
    expect(new Set(rows.map((r) => r.at)).size).toBe(1);
    expect(rows.map((r) => (r.type === "run_paused" ? r.reason : null))).toEqual(["a", "b", "c"]);
    w.close();
    w.close();
    expect(readFileSync(path, "utf8").split("\n")).toHaveLength(6);
  });

  it.skipIf(!existsSync("/proc/self/fd"))(
    "closing a writer releases its file descriptor, and closing it again is a no-op",
    () => {
      const path = fresh();
      const openFds = () => readdirSync("/proc/self/fd").length;
      const before = openFds();
      const w = JournalWriter.create(path, "r1");
      w.append([paused("a")]);
      expect(openFds()).toBe(before + 1);
      w.close();
      expect(openFds()).toBe(before);
      w.close();
      expect(openFds()).toBe(before);
      const { writer } = JournalWriter.open(path);
      expect(openFds()).toBe(before + 1);
      writer.close();
      expect(openFds()).toBe(before);
    },
  );

  it("writes a batch much larger than one write call whole", () => {
    const path = fresh();
    const w = JournalWriter.create(path, "r1");
    const big = Array.from({ length: 2000 }, (_, i) => paused(`reason ${i} ${"x".repeat(100)}`));
    w.append(big);
    w.close();
    expect(readJournalFile(path).rows).toHaveLength(2000);
  });
});
