import {
  closeSync,
  existsSync,
  fdatasync,
  fdatasyncSync,
  ftruncateSync,
  openSync,
  readFileSync,
  writeSync,
} from "node:fs";
import { FlowError } from "../util/errors.js";
import { writeFileAtomic } from "../util/fsx.js";
import { type FaultPoint, faultKey, parseFaultPoint } from "./fault.js";
import {
  JOURNAL_FORMAT,
  JOURNAL_VERSION,
  type JournalHeader,
  JournalHeaderSchema,
  type JournalRow,
  JournalRowSchema,
  type NewRow,
} from "./rows.js";

export const JOURNAL_FILE = "journal.jsonl";

export interface JournalRead {
  header: JournalHeader;
  rows: JournalRow[];
  /** A last line with no newline: a write the crash cut. It is ignored and reported, never read. */
  torn: { offset: number; bytes: number } | null;
  /** The byte length of the whole lines (what a writer keeps when it truncates the torn tail). */
  validBytes: number;
}

/**
 * Reads a journal. The first line is the version header; a torn last line is ignored and reported; a line
 * in the middle that is not a valid row is corruption and throws `journal_corrupt` naming its line.
 */
export function parseJournal(text: string, source = "journal"): JournalRead {
  const lines = text.split("\n");
  const tail = lines.pop() ?? "";
  const validBytes = Buffer.byteLength(text) - Buffer.byteLength(tail);
  const torn = tail.length > 0 ? { offset: validBytes, bytes: Buffer.byteLength(tail) } : null;
  const first = lines.shift();
  if (first === undefined) {
    throw new FlowError("journal_corrupt", `${source}: no header line`, 1);
  }
  const header = JournalHeaderSchema.safeParse(safeJson(first));
  if (!header.success) throw new FlowError("journal_corrupt", `${source}: line 1 is not a journal header`, 1);
  if (header.data.version > JOURNAL_VERSION) {
    throw new FlowError(
      "journal_version",
      `${source}: journal version ${header.data.version} is newer than this crw reads (${JOURNAL_VERSION})`,
      1,
    );
  }
  const rows: JournalRow[] = [];
  lines.forEach((line, i) => {
    const parsed = JournalRowSchema.safeParse(safeJson(line));
    if (!parsed.success) {
      throw new FlowError(
        "journal_corrupt",
        `${source}: line ${i + 2} is not a valid row (${parsed.error.issues[0]?.message ?? "invalid"})`,
        1,
        { line: i + 2 },
      );
    }
    rows.push(parsed.data);
  });
  return { header: header.data, rows, torn, validBytes };
}

function safeJson(line: string): unknown {
  try {
    return JSON.parse(line);
  } catch {
    return undefined;
  }
}

export function readJournalFile(path: string): JournalRead {
  return parseJournal(readFileSync(path, "utf8"), path);
}

/** What a writer measured, for the benchmark and `crw flow show`. */
export interface JournalStats {
  batches: number;
  rows: number;
  bytes: number;
  fsyncs: number;
}

/** A batch written to the file, not yet known durable; its promise settles when an fsync covers it. */
interface Unsynced {
  rows: JournalRow[];
  settled: boolean;
  /** Settles with the batch (never rejects: its append's promise carries the error). */
  done: Promise<void>;
  resolve(rows: JournalRow[]): void;
  reject(error: Error): void;
}

/**
 * The run process's journal writer: the one writer of the run. Each `append` is one batch: validated,
 * written, fdatasync'd, and only then returned, so whatever the batch announces happens after it is
 * durable. `appendDurable` is the same batch with the fdatasync off the event loop: it answers once an
 * fdatasync begun after its write has finished, and batches written while one is in flight share the next
 * (group commit: fewer fsyncs, never a row announced before it is durable). A row joins `rows` (and
 * `onDurable` hears of it) only once it is durable, always in file order, so nothing is decided from a
 * row a crash could still take back. A fault point (CRW_FLOW_FAULT=after:<row type>[/<action>]:<n>)
 * SIGKILLs the process right after the n-th durable row of that type (and action) this process wrote: the
 * crash tests' journal boundaries.
 */
export class JournalWriter {
  readonly rows: JournalRow[];
  readonly stats: JournalStats = { batches: 0, rows: 0, bytes: 0, fsyncs: 0 };
  /** Hears every batch once it is durable, in file order (before its append answers). */
  onDurable: ((rows: JournalRow[]) => void) | null = null;
  private fd: number;
  private seq: number;
  private readonly fault: FaultPoint | null;
  private readonly faultCounts = new Map<string, number>();
  /** Written, waiting for the next fdatasync. */
  private waiting: Unsynced[] = [];
  /** Covered by the fdatasync in flight. */
  private inFlight: Unsynced[] = [];

  private constructor(fd: number, rows: JournalRow[], fault: FaultPoint | null) {
    this.fd = fd;
    this.rows = rows;
    this.seq = rows.length === 0 ? 0 : (rows[rows.length - 1]?.seq ?? 0) + 1;
    this.fault = fault;
  }

  /** Creates a new journal with its header (fails if one exists). */
  static create(path: string, runId: string, env: NodeJS.ProcessEnv = process.env): JournalWriter {
    if (existsSync(path)) throw new FlowError("journal_corrupt", `${path} exists already`, 1);
    const header: JournalHeader = {
      format: JOURNAL_FORMAT,
      version: JOURNAL_VERSION,
      run_id: runId,
      created_at: new Date().toISOString(),
    };
    // The header lands whole or not at all: a reader (or a crash) never sees a journal without one.
    writeFileAtomic(path, `${JSON.stringify(header)}\n`, true);
    const fd = openSync(path, "a");
    return new JournalWriter(fd, [], parseFaultPoint(env.CRW_FLOW_FAULT));
  }

  /** Opens an existing journal for appending; a torn tail is cut off and reported through `read.torn`. */
  static open(
    path: string,
    env: NodeJS.ProcessEnv = process.env,
  ): { writer: JournalWriter; read: JournalRead } {
    const read = readJournalFile(path);
    const fd = openSync(path, "r+");
    if (read.torn) {
      ftruncateSync(fd, read.validBytes);
      fdatasyncSync(fd);
    }
    closeSync(fd);
    const afd = openSync(path, "a");
    return { writer: new JournalWriter(afd, [...read.rows], parseFaultPoint(env.CRW_FLOW_FAULT)), read };
  }

  append(batch: NewRow[]): JournalRow[] {
    if (batch.length === 0) return [];
    const rows = this.write(batch);
    fdatasyncSync(this.fd);
    this.stats.fsyncs++;
    // this fdatasync covers every batch written before this one too: they are durable first (file order)
    this.settle([...this.inFlight, ...this.waiting.splice(0)]);
    this.durable(rows);
    return rows;
  }

  /** The batch, answered once durable; the event loop goes on meanwhile (other calls, the host, the owner). */
  appendDurable(batch: NewRow[]): Promise<JournalRow[]> {
    if (batch.length === 0) return Promise.resolve([]);
    const rows = this.write(batch);
    let resolve: (rows: JournalRow[]) => void = () => {};
    let reject: (error: Error) => void = () => {};
    const answer = new Promise<JournalRow[]>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    const done = answer.then(
      () => {},
      () => {},
    );
    this.waiting.push({ rows, settled: false, resolve, reject, done });
    this.flush();
    return answer;
  }

  /**
   * Answers once every batch written so far is durable (or failed): a reader of the file may already see
   * those rows, so whoever answers from `rows` what such a reader asks waits for this first.
   */
  flushed(): Promise<void> {
    const open = [...this.inFlight, ...this.waiting].filter((u) => !u.settled);
    return open[open.length - 1]?.done ?? Promise.resolve();
  }

  private write(batch: NewRow[]): JournalRow[] {
    const at = new Date().toISOString();
    const rows = batch.map((r) => JournalRowSchema.parse({ ...r, seq: this.seq++, at }));
    const text = rows.map((r) => `${JSON.stringify(r)}\n`).join("");
    const buf = Buffer.from(text);
    let off = 0;
    while (off < buf.length) off += writeSync(this.fd, buf, off);
    this.stats.batches++;
    this.stats.rows += rows.length;
    this.stats.bytes += buf.length;
    return rows;
  }

  /** One fdatasync at a time: the batches written meanwhile wait for the next (they share it). */
  private flush(): void {
    if (this.inFlight.length > 0 || this.waiting.length === 0) return;
    this.inFlight = this.waiting.splice(0);
    const covered = this.inFlight;
    fdatasync(this.fd, (err) => {
      if (this.inFlight === covered) this.inFlight = [];
      if (err) {
        for (const u of covered.filter((x) => !x.settled)) {
          u.settled = true;
          u.reject(err);
        }
      } else {
        this.stats.fsyncs++;
        this.settle(covered);
      }
      this.flush();
    });
  }

  private settle(batches: Unsynced[]): void {
    for (const u of batches) {
      if (u.settled) continue;
      u.settled = true;
      this.durable(u.rows);
      u.resolve(u.rows);
    }
  }

  private durable(rows: JournalRow[]): void {
    this.rows.push(...rows);
    this.onDurable?.(rows);
    if (this.fault) {
      for (const r of rows) {
        const key = faultKey(this.fault, r);
        if (key === null) continue;
        const n = (this.faultCounts.get(key) ?? 0) + 1;
        this.faultCounts.set(key, n);
        if (n === this.fault.n) process.kill(process.pid, "SIGKILL");
      }
    }
  }

  /** Makes what is written durable (a batch still waiting is answered), then closes the file. */
  close(): void {
    if (this.fd < 0) return;
    const open = [...this.inFlight, ...this.waiting.splice(0)].filter((u) => !u.settled);
    if (open.length > 0) {
      fdatasyncSync(this.fd);
      this.stats.fsyncs++;
      this.settle(open);
    }
    closeSync(this.fd);
    this.fd = -1;
  }
}
