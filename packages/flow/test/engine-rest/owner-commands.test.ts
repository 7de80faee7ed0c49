import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { lockHolder, pidAlive, readJournalFile, runPaths } from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { fileStepSource, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { readBinding } from "../../src/bound/index.js";
import { ensureBoundDir } from "../../src/bound/store.js";
import { crwBin, crwFlow, ownerSession, waitFor } from "../helpers/cli.js";
import { type InProcessRun, inProcessRun } from "../helpers/harness.js";

/** The workflow reports the TMPDIR its run process runs below. */
const workflowSource = `
export default {
  name: "rest",
  async run(ctx) {
    await ctx.call({ role: "explorer", task: "t", schema: { type: "object" } });
    return { tmp: process.env.TMPDIR ?? null };
  },
};
`;

let fake: FakeAppServer;
let root: string;
let owner: string;
let env: NodeJS.ProcessEnv;
let workflowPath: string;
const pids: number[] = [];

beforeAll(async () => {
  ({ fake, root, owner, env } = await ownerSession("crw-flow-rest-"));
  workflowPath = join(root, "rest.mjs");
  writeFileSync(workflowPath, workflowSource);
}, 120_000);

afterAll(async () => {
  for (const pid of pids) if (pidAlive(pid)) process.kill(pid, "SIGKILL");
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

let inProc: InProcessRun | null = null;
afterEach(async () => {
  await inProc?.close();
  inProc = null;
});

/** The journal's bytes and its file's identity: what a write of any kind would change. */
function snapshot(path: string) {
  const s = statSync(path);
  return { bytes: readFileSync(path).toString("base64"), size: s.size, mtimeMs: s.mtimeMs, ino: s.ino };
}

async function startRun(runId: string, tmp: string) {
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  const r = await crwFlow(
    ["start", workflowPath, "--run", runId, "--state", state, "--poll-ms", "20", "--json"],
    { ...env, TMPDIR: tmp },
    root,
  );
  expect(r.code, r.stderr).toBe(0);
  const pid = Number(r.json().pid);
  pids.push(pid);
  await waitFor(
    "started row",
    () => existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
  );
  return { state, paths, pid };
}

describe("the owner's commands and the run's locks", () => {
  it("no owner command writes the journal; only the run process does (paused and ended runs) (S000-179)", async () => {
    // A paused run (a host failure held its call) and an ended one, no process holding either: whatever
    // an owner command does, the journal's bytes stay as the run process left them.
    // The seed is ambiguous here: `crw flow answer` is described as appending/storing a row. That command
    // drains a process and starts a resume that writes the row; it is not an owner command of this list.
    for (const kind of ["paused", "ended"] as const) {
      inProc = await inProcessRun({ runId: `rest-${kind}` });
      const one = {
        name: "one",
        run: (ctx: import("@crw/flow").FlowContext) => ctx.call({ role: "explorer", task: "t" }),
      };
      const { outcome } = await inProc.execute(one, () =>
        kind === "paused"
          ? { kind: "fail", codexErrorInfo: "internalServerError", message: "boom" }
          : { kind: "answer", messages: [{ text: "{}", phase: "final_answer" }] },
      );
      expect(outcome.state).toBe(kind === "paused" ? "paused" : "completed");
      const state = join(inProc.root, "state");
      const runId = `rest-${kind}`;
      const before = snapshot(inProc.paths.journal);
      const commands: string[][] = [
        ["next", runId, "--json"],
        ["next", runId, "--wait", "1", "--json"],
        ["next", runId],
        [
          "dispatched",
          runId,
          "explorer.1",
          "--agent",
          "a-x",
          "--k",
          "1",
          "--attempt",
          "1",
          "--wait",
          "1",
          "--json",
        ],
        ["dispatched", runId, "explorer.1", "--agent", "a-y", "--k", "9", "--attempt", "9", "--wait", "1"],
        ["show", runId, "--json"],
        ["show", runId],
        // a second start of the same run id is refused before it touches the run
        ["start", workflowPath, "--run", runId, "--json"],
      ];
      for (const args of commands) {
        const r = await crwFlow([...args, "--state", state], env, root);
        expect(r.code, `${args.join(" ")}: ${r.stderr}`).toBeLessThanOrEqual(2);
        expect(snapshot(inProc.paths.journal), args.join(" ")).toEqual(before);
      }
      const nextAnswer = await crwFlow(["next", runId, "--json", "--state", state], env, root);
      expect(nextAnswer.json()).toMatchObject({ state: kind });
      expect(nextAnswer.json()).not.toHaveProperty("resumed_pid");
      await inProc.close();
      inProc = null;
    }
  });

  it("tmploc is asked once, at the start: later commands and relaunches never consult the caller's TMPDIR (S000-185)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const { state, paths, pid } = await startRun("rest-tmp", recorded);
    const spec = readFileSync(paths.spec, "utf8");
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    // A TMPDIR tmploc refuses (not absolute): a start from this shell stops at once...
    const bad = { ...env, TMPDIR: "not/absolute" };
    const refused = await crwFlow(
      ["start", workflowPath, "--run", "rest-tmp-2", "--state", state],
      bad,
      root,
    );
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("TMPDIR");
    // ...and every later command of the started run, from the same shell, does its work
    const next = await crwFlow(["next", "rest-tmp", "--state", state, "--json"], bad, root);
    expect(next.code, next.stderr).toBe(0);
    const resumed = Number(next.json().resumed_pid);
    expect(resumed).toBeGreaterThan(0);
    pids.push(resumed);
    expect(next.stdout + next.stderr).not.toContain("not/absolute");
    const kit = new ScriptedOwner({
      fake,
      owner,
      source: fileStepSource({ state, runId: "rest-tmp", replyWaitMs: 2000 }),
      behave: () => ({ kind: "answer", messages: [{ text: "{}", phase: "final_answer" }] }),
    }).start();
    try {
      await waitFor(
        "the run to end",
        () => readJournalFile(paths.journal).rows.some((x) => x.type === "run_ended"),
        30_000,
      );
    } finally {
      await kit.stop();
    }
    // the relaunched process ran below the directory the start's tmploc answered
    expect(readJournalFile(paths.journal).rows.at(-1)).toMatchObject({
      type: "run_ended",
      result: { tmp: recorded },
    });
    const show = await crwFlow(["show", "rest-tmp", "--state", state, "--json"], bad, root);
    expect(show.code, show.stderr).toBe(0);
    expect(readFileSync(paths.spec, "utf8")).toBe(spec); // the record is never asked again or rewritten
  });

  it("crw flow start --token-ceiling N records the run's token ceiling in run.json; a bad one is an input error before the run exists", async () => {
    const state = join(root, "state");
    const bad = await crwFlow(
      ["start", workflowPath, "--run", "rest-ceiling-bad", "--state", state, "--token-ceiling", "0"],
      env,
      root,
    );
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--token-ceiling");
    expect(existsSync(runPaths(state, "rest-ceiling-bad").dir)).toBe(false);
    const r = await crwFlow(
      ["start", workflowPath, "--run", "rest-ceiling", "--state", state, "--token-ceiling", "5000", "--json"],
      env,
      root,
    );
    expect(r.code, r.stderr).toBe(0);
    pids.push(Number(r.json().pid));
    expect(JSON.parse(readFileSync(runPaths(state, "rest-ceiling").spec, "utf8"))).toMatchObject({
      token_ceiling: 5000,
    });
  });

  it("start.lock is held from before the start binds until the run's process holds the run lock (S000-268)", async () => {
    // The run process is made slow to come up (a preload that waits in `crw flow _run` only), so the
    // start's hand-over is long enough to watch: at no moment is the run live by neither lock.
    const slow = join(root, "slow-run.mjs");
    writeFileSync(
      slow,
      'if (process.argv.includes("_run")) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 800);\n',
    );
    const state = join(root, "state");
    const paths = runPaths(state, "rest-lock");
    // an owner of its own, so no other test's live run holds its line
    const lockOwner = fake.createOwnerThread({ cwd: root });
    fake.startOwnerTurn(lockOwner);
    const startEnv = {
      ...env,
      CODEX_THREAD_ID: lockOwner,
      TMPDIR: tmpdir(),
      NODE_OPTIONS: `${env.NODE_OPTIONS ?? ""} --import ${slow}`.trim(),
    };
    // This test holds the flow-bound lock as the start comes up: the start's bind waits for it, and by
    // then the start lock must be the start's. It is let go once that is seen.
    const boundLock = join(ensureBoundDir(state), ".lock");
    writeFileSync(boundLock, JSON.stringify({ pid: process.pid, nonce: "test-holder" }));
    let atRelease: { start: number | null; line: string | null } | null = null;
    const child = spawn(
      process.execPath,
      [crwBin, "flow", "start", workflowPath, "--run", "rest-lock", "--state", state, "--json"],
      { env: startEnv, cwd: root, stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    const samples: Array<{ spec: boolean; start: number | null; run: number | null }> = [];
    const exited = new Promise<number>((r) => child.on("exit", (code) => r(code ?? -1)));
    let done = false;
    void exited.then(() => {
      done = true;
    });
    while (!done) {
      const sample = {
        spec: existsSync(paths.spec),
        start: lockHolder(paths.startLock)?.pid ?? null,
        run: lockHolder(paths.runLock)?.pid ?? null,
      };
      samples.push(sample);
      if (atRelease === null && sample.start === child.pid && sample.spec) {
        atRelease = { start: sample.start, line: readBinding(state, lockOwner).line?.run_id ?? null };
        unlinkSync(boundLock);
      }
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(await exited).toBe(0);
    const runPid = Number((JSON.parse(out) as { pid: number }).pid);
    pids.push(runPid);
    samples.push({
      spec: existsSync(paths.spec),
      start: lockHolder(paths.startLock)?.pid ?? null,
      run: lockHolder(paths.runLock)?.pid ?? null,
    });
    const first = samples.findIndex((s) => s.start !== null);
    expect(first).toBeGreaterThanOrEqual(0);
    // the start holds it, not the run process; the spec (and the bind, which sits in the same locked
    // section of the start) is written only under it
    expect(samples[first]?.start).toBe(child.pid);
    expect(samples.slice(0, first).every((s) => !s.spec)).toBe(true);
    // from then on the run is live by one lock or the other, with no gap
    for (const s of samples.slice(first))
      expect(s.start !== null || s.run !== null, JSON.stringify(s)).toBe(true);
    // the start lock covered the run process's slow coming up (it lived and did not hold the run lock yet)
    expect(samples.some((s) => s.start === child.pid && s.run === null && s.spec)).toBe(true);
    // and it is let go only once the run's process holds the run lock
    // the bind waited under the start lock: nothing bound while the start held it and the bind waited,
    // and the bind done once the flow-bound lock was let go
    expect(atRelease).toEqual({ start: child.pid, line: null });
    expect(readBinding(state, lockOwner).line?.run_id).toBe("rest-lock");
    const last = samples[samples.length - 1];
    expect(last).toMatchObject({ start: null, run: runPid });
    const firstRun = samples.findIndex((s) => s.run !== null);
    expect(firstRun).toBeGreaterThan(first);
    expect(lockHolder(paths.runLock)?.pid).toBe(runPid);
  });
});
