import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, watch, writeFileSync } from "node:fs";
import { join } from "node:path";
import { lockHolder, pidAlive, readJournalFile, readSpec, runPaths, writeSpec } from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { fileStepSource, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ownerSession, waitFor } from "./helpers/cli.js";

/** The workflow reports the TMPDIR its run process runs below. */
const workflowSource = `
export default {
  name: "env",
  async run(ctx) {
    await ctx.call({ role: "explorer", task: "t", schema: { type: "object" } });
    const os = await import("node:os");
    return { tmp: process.env.TMPDIR ?? null, os: os.tmpdir(), mark: process.env.CRW_FLOW_ENV_MARK ?? null };
  },
};
`;

/** A run that waits for one decision and reports the TMPDIR entries its process was launched with. */
const decideSource = `
import { readFileSync } from "node:fs";
export default {
  name: "decide",
  async run(ctx) {
    const ship = await ctx.decide({ id: "ship", question: "Ship it?", options: ["yes", "no"] });
    const launched = readFileSync("/proc/self/environ", "utf8")
      .split("\\0")
      .filter((e) => e.startsWith("TMPDIR=") || e.startsWith("CRW_FLOW_ENV_MARK="))
      .sort();
    return { ship, launched };
  },
};
`;

let fake: FakeAppServer;
let root: string;
let owner: string;
let env: NodeJS.ProcessEnv;
let workflowPath: string;

beforeAll(async () => {
  ({ fake, root, owner, env } = await ownerSession("crw-flow-env-"));
  workflowPath = join(root, "env.mjs");
  writeFileSync(workflowPath, workflowSource);
}, 120_000);

afterAll(async () => {
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

/** Starts a run below `startTmp`, kills its process once it has its started row, and returns its paths. */
async function startAndKill(runId: string, startTmp: string) {
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  const r = await crwFlow(
    ["start", workflowPath, "--run", runId, "--state", state, "--poll-ms", "20", "--json"],
    { ...env, TMPDIR: startTmp, CRW_FLOW_ENV_MARK: "starter" },
    root,
  );
  expect(r.code, r.stderr).toBe(0);
  const pid = Number(r.json().pid);
  const launched = environOf(pid);
  await waitFor(
    "started row",
    () => existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
  );
  process.kill(pid, "SIGKILL");
  await waitFor("the process to die", () => !pidAlive(pid));
  return { state, paths, launched };
}

/** The environment a process was launched with, as the kernel recorded it (one entry a string). */
function environOf(pid: number): string[] {
  return readFileSync(`/proc/${pid}/environ`, "utf8")
    .split("\0")
    .filter((e) => e !== "");
}

async function finish(runId: string, state: string): Promise<unknown> {
  const paths = runPaths(state, runId);
  const kit = new ScriptedOwner({
    fake,
    owner,
    source: fileStepSource({ state, runId, replyWaitMs: 2000 }),
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
  const last = readJournalFile(paths.journal).rows.at(-1);
  return last?.type === "run_ended" ? last.result : undefined;
}

describe("the run's recorded environment", () => {
  describe("a run started below one TMPDIR, killed, and resumed --detach from a shell with another", () => {
    let recorded: string;
    let result: unknown;
    let launched: string[];
    let started: string[];
    let other: string;
    let packets: string[];
    let specPath: string;
    beforeAll(async () => {
      recorded = mkdtempSync(join(root, "recorded-"));
      other = mkdtempSync(join(root, "other-"));
      const { state, paths, launched: atStart } = await startAndKill("env-1", recorded);
      started = atStart;
      specPath = paths.spec;
      const r = await crwFlow(["resume", "env-1", "--detach", "--state", state, "--json"], {
        ...env,
        TMPDIR: other,
        CRW_FLOW_ENV_MARK: "resumer",
      });
      expect(r.code, r.stderr).toBe(0);
      launched = environOf(Number(r.json().resumed_pid));
      // No owner runs until the relaunched process has published: a step the killed process had already
      // published (its row stands) is looked up, found nowhere and written again by the relaunched
      // process; a step it had not is published afresh. Either way every packet is the relaunched one's.
      const relaunched = () => {
        const rows = readJournalFile(paths.journal).rows;
        const starts = rows.flatMap((x) => (x.type === "started" ? [Date.parse(x.at)] : []));
        const at = starts.length >= 2 ? (starts.at(-1) ?? Number.NaN) : Number.NaN;
        const steps = rows.flatMap((x) => (x.type === "step_published" ? [x.packet] : []));
        const rewritten = steps.every((p) => existsSync(p) && statSync(p).mtimeMs >= at - 5);
        return steps.length > 0 && rewritten ? steps : null;
      };
      const published = await waitFor("the relaunched process to publish", relaunched, 30_000);
      packets = published.map((p) => readFileSync(p, "utf8"));
      result = await finish("env-1", state);
    }, 60_000);

    it("the packet the relaunched process publishes names the TMPDIR run.json records, never the shell's (S000-043)", () => {
      expect(packets.length).toBeGreaterThan(0);
      for (const p of packets) {
        expect(p).toContain(`The run's temporary directory is ${recorded} (env.TMPDIR of ${specPath});`);
        expect(p).toContain(`TMPDIR=${recorded}`);
        expect(p).not.toContain(other);
      }
    });

    it("the detached process is launched with the resuming shell's environment and the spec's TMPDIR in place of the shell's, once (S000-238)", () => {
      expect(launched.filter((e) => e.startsWith("TMPDIR="))).toEqual([`TMPDIR=${recorded}`]);
      expect(launched).toContain("CRW_FLOW_ENV_MARK=resumer");
      expect(result).toMatchObject({ mark: "resumer" });
    });

    it("the start's detached process is launched with the starting shell's environment and one TMPDIR entry (S000-238)", () => {
      expect(started.filter((e) => e.startsWith("TMPDIR="))).toEqual([`TMPDIR=${recorded}`]);
      expect(started).toContain("CRW_FLOW_ENV_MARK=starter");
    });

    it("the relaunched run runs below the TMPDIR its start recorded, not the shell's other one (S000-239)", () => {
      expect(result).toMatchObject({ tmp: recorded });
    });

    it("the run's temporary files (os.tmpdir) land below the recorded TMPDIR", () => {
      expect(result).toMatchObject({ os: recorded });
    });
  });

  it("a run relaunched from a shell with no TMPDIR runs below the TMPDIR its start recorded (S000-239)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const { state } = await startAndKill("env-4", recorded);
    const { TMPDIR: _none, ...bare } = env;
    const r = await crwFlow(["resume", "env-4", "--detach", "--state", state, "--json"], bare);
    expect(r.code, r.stderr).toBe(0);
    expect(environOf(Number(r.json().resumed_pid)).filter((e) => e.startsWith("TMPDIR="))).toEqual([
      `TMPDIR=${recorded}`,
    ]);
    expect(await finish("env-4", state)).toMatchObject({ tmp: recorded, os: recorded });
  });

  it("next's resume launches the run's process with the asking shell's environment and the recorded TMPDIR in place, once (S000-238)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const other = mkdtempSync(join(root, "other-"));
    const { state } = await startAndKill("env-5", recorded);
    const r = await crwFlow(["next", "env-5", "--state", state, "--json"], {
      ...env,
      TMPDIR: other,
      CRW_FLOW_ENV_MARK: "asker",
    });
    expect(r.code, r.stderr).toBe(0);
    const launched = environOf(Number(r.json().resumed_pid));
    expect(launched.filter((e) => e.startsWith("TMPDIR="))).toEqual([`TMPDIR=${recorded}`]);
    expect(launched).toContain("CRW_FLOW_ENV_MARK=asker");
    expect(await finish("env-5", state)).toMatchObject({ tmp: recorded, mark: "asker" });
  });

  it("crw flow answer's resume launches the run's process with the answering shell's environment and the recorded TMPDIR in place, once (S000-238)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const other = mkdtempSync(join(root, "other-"));
    const state = join(root, "state");
    const paths = runPaths(state, "env-6");
    const workflow = join(root, "decide.mjs");
    writeFileSync(workflow, decideSource);
    // a local run: no owner thread, no host
    const { CODEX_THREAD_ID: _t, CRW_FLOW_HOST: _h, ...local } = env;
    const start = await crwFlow(
      ["start", workflow, "--run", "env-6", "--state", state, "--json"],
      { ...local, TMPDIR: recorded },
      root,
    );
    expect(start.code, start.stderr).toBe(0);
    await waitFor(
      "the run to pause for its decision and let the run go",
      () =>
        existsSync(paths.journal) &&
        readJournalFile(paths.journal).rows.some((x) => x.type === "run_paused") &&
        lockHolder(paths.runLock) === null,
      30_000,
    );
    const r = await crwFlow(["answer", "env-6", "ship", "yes", "--state", state, "--json"], {
      ...local,
      TMPDIR: other,
      CRW_FLOW_ENV_MARK: "answerer",
    });
    expect(r.code, r.stderr).toBe(0);
    const ended = await waitFor(
      "the run to end",
      () => readJournalFile(paths.journal).rows.find((x) => x.type === "run_ended"),
      30_000,
    );
    expect(ended).toMatchObject({
      result: { ship: "yes", launched: ["CRW_FLOW_ENV_MARK=answerer", `TMPDIR=${recorded}`] },
    });
  });

  it("a spec written before the env record leaves the launched process the caller's environment (S000-240)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const other = mkdtempSync(join(root, "other-"));
    const { state, paths } = await startAndKill("env-2", recorded);
    const { env: _dropped, ...legacy } = readSpec(paths.spec);
    writeSpec(paths.spec, legacy);
    const r = await crwFlow(["resume", "env-2", "--detach", "--state", state, "--json"], {
      ...env,
      TMPDIR: other,
    });
    expect(r.code, r.stderr).toBe(0);
    expect(await finish("env-2", state)).toMatchObject({ tmp: other });
  });

  it("an in-process run (foreground resume) with an unusable recorded TMPDIR is refused with exit 2 before any lock or row (S000-251)", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const { state, paths } = await startAndKill("env-3", recorded);
    rmSync(recorded, { recursive: true });
    const before = readFileSync(paths.journal, "utf8");
    // every name the run's directory sees change while the resume runs: a lock taken and let go shows
    const changed: string[] = [];
    const watcher = watch(paths.dir, (_event, name) => {
      if (name) changed.push(String(name));
    });
    let r: Awaited<ReturnType<typeof crwFlow>>;
    try {
      r = await crwFlow(["resume", "env-3", "--state", state], env);
      // the watch reports in order: once this file's change is in, every earlier one is
      writeFileSync(join(paths.dir, "watch-mark"), "");
      await waitFor("the watch to catch up", () => changed.includes("watch-mark"));
    } finally {
      watcher.close();
    }
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(recorded);
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
    // no lock file was taken, not even for a moment (the run's process lock or its run lock)
    expect(changed.filter((n) => n.endsWith(".lock"))).toEqual([]);
  });
});
