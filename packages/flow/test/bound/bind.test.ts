import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  bindingFile,
  bindOrchestrator,
  boundDir,
  closeOrchestrator,
  helperPairsFrom,
  readBinding,
  runIsLive,
  serializeLine,
} from "../../src/bound/index.js";
import { ensureBoundDir } from "../../src/bound/store.js";
import { runPaths } from "../../src/run/paths.js";
import { until } from "../helpers/harness.js";

let state: string;
const owner = "019a0000-aaaa-7000-8000-000000000001";
const pairs = helperPairsFrom({
  executor: { model: "m-exec", effort: "high" },
  reviewer: { model: "m-rev", effort: null },
});

beforeEach(() => {
  state = mkdtempSync(join(tmpdir(), "crw-bound-"));
});
afterEach(() => {
  rmSync(state, { recursive: true, force: true });
});

/** Holds a run's lock the way a live process does: a lock file naming a live pid (this test's). */
function holdLock(runId: string, which: "runLock" | "startLock", pid = process.pid): void {
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  writeFileSync(paths[which], JSON.stringify({ pid }));
}

function deadPid(): number {
  const child = spawnSync(process.execPath, ["-e", "0"]);
  return child.pid as number;
}

const lines = () =>
  readFileSync(bindingFile(state, owner), "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));

const bind = (runId: string, digest = `d-${runId}`) =>
  bindOrchestrator({ state, owner, runId, policyDigest: digest, helperPairs: pairs });

describe("BindOrchestrator / CloseOrchestrator", () => {
  it("a live run is one whose process holds its run lock or whose start holds its start lock (S000-269)", () => {
    expect(runIsLive(state, "r1")).toBe(false);
    holdLock("r1", "startLock");
    expect(runIsLive(state, "r1")).toBe(true);
    holdLock("r2", "runLock");
    expect(runIsLive(state, "r2")).toBe(true);
    holdLock("r3", "runLock", deadPid());
    holdLock("r3", "startLock", deadPid());
    expect(runIsLive(state, "r3")).toBe(false);
  });

  it("binds a thread: the line is the owner's last line, read back as its binding, in a 0700 directory", () => {
    holdLock("r1", "startLock");
    const outcome = bind("r1");
    expect(outcome).toMatchObject({ bound: true, wrote: true, closedStale: null });
    const read = readBinding(state, owner);
    expect(read.warning).toBeNull();
    expect(read.line).toMatchObject({ kind: "orchestrator", run_id: "r1", policyDigest: "d-r1" });
    expect(read.line?.helperPairs.executor).toEqual({ model: "m-exec", effort: "high" });
    expect(read.line?.helperPairs.reviewer).toEqual({ model: "m-rev" });
    // the same run and table again writes nothing; a new digest (a repin) is a new line
    expect(bind("r1")).toMatchObject({ bound: true, wrote: false });
    expect(bind("r1", "d-r1-repinned")).toMatchObject({ bound: true, wrote: true });
    expect(lines().map((l) => l.policyDigest)).toEqual(["d-r1", "d-r1-repinned"]);
  });

  it("a thread holds the line of one live run: a second start while the first is starting, or once its process lives, does not bind (S000-271)", () => {
    holdLock("r1", "startLock");
    holdLock("r2", "startLock");
    expect(bind("r1")).toMatchObject({ bound: true });
    const second = bind("r2");
    expect(second).toMatchObject({ bound: false, reason: "other_live_run", liveRun: "r1" });
    expect(second.bound === false && second.message).toMatch(/live run r1/);
    // r1's start has handed over to its process: the start lock is gone, the run lock held
    rmSync(runPaths(state, "r1").startLock);
    holdLock("r1", "runLock");
    expect(bind("r2")).toMatchObject({ bound: false, reason: "other_live_run", liveRun: "r1" });
    expect(readBinding(state, owner).line?.run_id).toBe("r1");
    expect(lines()).toHaveLength(1);
  });

  it("the open line of a run that is not live is closed before the new line is written (S000-270)", () => {
    holdLock("r1", "runLock", deadPid());
    expect(bind("r1")).toMatchObject({ bound: true });
    holdLock("r2", "startLock");
    expect(bind("r2")).toMatchObject({ bound: true, closedStale: "r1" });
    expect(lines().map((l) => [l.kind, l.run_id])).toEqual([
      ["orchestrator", "r1"],
      ["closed", "r1"],
      ["orchestrator", "r2"],
    ]);
  });

  it("CloseOrchestrator closes the run's own line, never another run's", () => {
    holdLock("r1", "runLock");
    bind("r1");
    expect(closeOrchestrator({ state, owner, runId: "r2" })).toMatchObject({ closed: false });
    expect(readBinding(state, owner).line?.run_id).toBe("r1");
    expect(closeOrchestrator({ state, owner, runId: "r1" })).toMatchObject({ closed: true });
    expect(readBinding(state, owner)).toMatchObject({ line: null, last: { kind: "closed", run_id: "r1" } });
    expect(closeOrchestrator({ state, owner, runId: "r1" })).toMatchObject({ closed: false });
    // a closed thread binds the next run at once
    holdLock("r2", "startLock");
    expect(bind("r2")).toMatchObject({ bound: true, closedStale: null });
  });

  it("a torn last line (a write cut short) is cut off before the next append", () => {
    holdLock("r1", "runLock");
    bind("r1");
    writeFileSync(
      bindingFile(state, owner),
      `${readFileSync(bindingFile(state, owner), "utf8")}{"v":1,"kind":"clo`,
    );
    expect(readBinding(state, owner).line?.run_id).toBe("r1");
    expect(closeOrchestrator({ state, owner, runId: "r1" })).toMatchObject({ closed: true });
    expect(lines().map((l) => l.kind)).toEqual(["orchestrator", "closed"]);
  });

  it("a thread whose binding cannot be written is an outcome (never a throw) the start warns about", () => {
    writeFileSync(boundDir(state), "not a directory");
    const outcome = bind("r1");
    expect(outcome).toMatchObject({ bound: false });
    expect(outcome.bound === false && outcome.message).toMatch(/cannot be written/);
    rmSync(boundDir(state));
    mkdirSync(bindingFile(state, owner), { recursive: true });
    expect(bind("r1")).toMatchObject({ bound: false });
    expect(
      bindOrchestrator({ state, owner: "../x", runId: "r1", policyDigest: "d", helperPairs: pairs }),
    ).toMatchObject({
      bound: false,
      reason: "unwritable",
    });
  });

  it("an untrusted flow-bound directory or file reads as no binding, with a warning (S000-288)", () => {
    holdLock("r1", "runLock");
    bind("r1");
    chmodSync(boundDir(state), 0o777);
    expect(readBinding(state, owner)).toMatchObject({ line: null });
    expect(readBinding(state, owner).warning).toMatch(/writable by group or others/);
    expect(bind("r1")).toMatchObject({ bound: false, reason: "untrusted" });
    chmodSync(boundDir(state), 0o700);
    const file = bindingFile(state, owner);
    const real = join(state, "elsewhere.jsonl");
    writeFileSync(real, readFileSync(file));
    rmSync(file);
    symlinkSync(real, file);
    expect(readBinding(state, owner)).toMatchObject({
      line: null,
      warning: expect.stringMatching(/symbolic link/),
    });
    rmSync(file);
    writeFileSync(file, readFileSync(real), { mode: 0o666 });
    chmodSync(file, 0o666);
    expect(readBinding(state, owner)).toMatchObject({
      line: null,
      warning: expect.stringMatching(/writable by group or others/),
    });
    // the same file, trusted again, is the binding: the warnings above were the file's trust alone
    chmodSync(file, 0o600);
    expect(readBinding(state, owner)).toMatchObject({ line: { run_id: "r1" }, warning: null });
  });
});

describe("two near-simultaneous starts of one thread (real processes)", () => {
  const children: ChildProcess[] = [];
  afterEach(() => {
    for (const c of children) c.kill("SIGKILL");
    children.length = 0;
  });

  /**
   * A start of `runId` on `thread` as a real process (it holds the run's start lock and binds at `at`);
   * `outcome` is its bind outcome, `printed` whether it has printed one yet.
   */
  function bindChild(thread: string, runId: string, at: number) {
    const require = createRequire(import.meta.url);
    const jiti = join(dirname(require.resolve("jiti/package.json")), "lib", "jiti-cli.mjs");
    const fixture = join(import.meta.dirname, "fixtures", "bind-child.ts");
    const child = spawn(process.execPath, [jiti, fixture, state, thread, runId, String(at)], {
      stdio: ["pipe", "pipe", "inherit"],
    });
    children.push(child);
    let out = "";
    const outcome = new Promise<Record<string, unknown>>((resolve, reject) => {
      child.stdout?.on("data", (d: Buffer) => {
        out += d.toString();
        if (out.includes("\n")) resolve(JSON.parse(out) as Record<string, unknown>);
      });
      child.on("exit", (code) => reject(new Error(`bind child exited ${code} before answering`)));
    });
    return { child, outcome, printed: () => out.length > 0 };
  }

  it("the read of the last line and the append are one step under the lock: exactly one binds (S000-272)", async () => {
    for (let round = 0; round < 2; round++) {
      const thread = `${owner}-${round}`;
      const at = Date.now() + 3_000;
      const outcomes = await Promise.all(
        ["a", "b"].map((name) => bindChild(thread, `run-${round}-${name}`, at).outcome),
      );
      const bound = outcomes.filter((o) => o.bound === true);
      expect(bound).toHaveLength(1);
      const refused = outcomes.find((o) => o.bound === false);
      expect(refused).toMatchObject({
        reason: "other_live_run",
        liveRun: (bound[0]?.line as { run_id: string } | undefined)?.run_id,
      });
      const file = readFileSync(join(boundDir(state), `${thread}.jsonl`), "utf8")
        .trim()
        .split("\n");
      expect(file).toHaveLength(1);
      for (const c of children) c.stdin?.end();
    }
  }, 60_000);

  it("a bind waits for the directory lock, and reads the last line only once it holds it: a line appended while it waited makes it refuse (S000-272)", async () => {
    // this test holds the flow-bound lock, as another start's bind in its read-and-append would
    const dir = ensureBoundDir(state);
    const lock = join(dir, ".lock");
    writeFileSync(lock, JSON.stringify({ pid: process.pid, nonce: "test-holder" }));
    const b = bindChild(owner, "r-late", Date.now());
    // the child holds its start lock before it binds: once that is taken, its bind is under way
    await until("the child's start lock", () => runIsLive(state, "r-late"));
    await new Promise((r) => setTimeout(r, 400));
    expect(b.printed()).toBe(false);
    expect(existsSync(bindingFile(state, owner)) ? readFileSync(bindingFile(state, owner), "utf8") : "").toBe(
      "",
    );
    // the other start appends its line and lets the lock go; its run is live
    holdLock("r-first", "startLock");
    writeFileSync(
      bindingFile(state, owner),
      `${serializeLine({ v: 1, kind: "orchestrator", run_id: "r-first", policyDigest: "d", helperPairs: pairs, at: new Date().toISOString() })}\n`,
      { mode: 0o600 },
    );
    unlinkSync(lock);
    expect(await b.outcome).toMatchObject({ bound: false, reason: "other_live_run", liveRun: "r-first" });
    expect(lines().map((l) => l.run_id)).toEqual(["r-first"]);
  }, 30_000);
});

describe("the engine's calls", () => {
  it("bindRunOwner takes a role table's pairs; ownerLineWarning reads the line and writes nothing", async () => {
    const { bindRunOwner, closeRunOwner, ownerLineWarning } = await import("../../src/bound/index.js");
    const run = { state, owner, runId: "r1" };
    expect(ownerLineWarning({ ...run, policyDigest: "p1" })).toMatchObject({ warning: "owner_line_missing" });
    holdLock("r1", "runLock");
    const bound = bindRunOwner({
      ...run,
      policyDigest: "p1",
      rolePairs: { executor: { model: "m", effort: null }, critic: { model: null, effort: null } },
    });
    expect(bound).toMatchObject({ bound: true, warning: null });
    expect(readBinding(state, owner).line?.helperPairs).toMatchObject({
      executor: { model: "m" },
      critic: {},
    });
    expect(ownerLineWarning({ ...run, policyDigest: "p1" })).toBeNull();
    expect(ownerLineWarning({ ...run, policyDigest: "p2" })).toMatchObject({
      warning: "owner_line_other_digest",
    });
    expect(ownerLineWarning({ ...run, runId: "r2", policyDigest: "p1" })).toMatchObject({
      warning: "owner_line_other_run",
    });
    const before = readFileSync(bindingFile(state, owner), "utf8");
    ownerLineWarning({ ...run, policyDigest: "p2" });
    expect(readFileSync(bindingFile(state, owner), "utf8")).toBe(before);
    expect(
      bindRunOwner({
        ...run,
        runId: "r9",
        policyDigest: "x",
        rolePairs: { explorer: { model: null, effort: "high" } },
      }),
    ).toMatchObject({ bound: false, warning: expect.stringMatching(/effort without a model/) });
    expect(closeRunOwner(run)).toMatchObject({ closed: true });
    expect(ownerLineWarning({ ...run, policyDigest: "p1" })).toMatchObject({ warning: "owner_line_missing" });
  });
});
