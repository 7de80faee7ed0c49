import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import {
  JournalWriter,
  lockHolder,
  pidAlive,
  readJournalFile,
  readSpec,
  runPaths,
  SPEC_FORMAT,
  writeSpec,
} from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { cliStepSource, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { crwBin, crwFlow, ownerSession, waitFor } from "./helpers/cli.js";

const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
const workflowSource = (extra = "") => `
const schema = ${JSON.stringify(schema)};
export default {
  name: "cli-pair",
  async run(ctx, input) {
    const [a, b] = await Promise.all([
      ctx.call({ role: "explorer", task: "count A${extra}", schema }),
      ctx.call({ role: "reviewer", task: "count B", schema }),
    ]);
    return { sum: a.n + b.n + input.base };
  },
};
`;

let fake: FakeAppServer;
let root: string;
let owner: string;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  ({ fake, root, owner, env } = await ownerSession("crw-flow-cli-"));
}, 120_000);

afterAll(async () => {
  await fake?.stop();
  rmSync(root, { recursive: true, force: true });
});

function workflow(name: string, extra = ""): string {
  const path = join(root, `${name}.mjs`);
  writeFileSync(path, workflowSource(extra));
  return path;
}

async function start(runId: string, extraArgs: string[] = [], e = env) {
  const state = join(root, "state");
  const r = await crwFlow(
    [
      "start",
      workflow(runId),
      "--run",
      runId,
      "--state",
      state,
      "--input",
      '{"base":100}',
      "--poll-ms",
      "20",
      "--json",
      ...extraArgs,
    ],
    e,
    root,
  );
  return { r, state, paths: runPaths(state, runId) };
}

describe("crw flow commands as real processes", () => {
  it("S000-180 S000-182 S000-183 S000-184 S000-186 S000-193 S000-178: start writes run.json (session backend, env.TMPDIR only) and names next", async () => {
    const tmp = mkdtempSync(join(root, "tmp-"));
    const { r, paths } = await start("run-start", [], { ...env, TMPDIR: tmp, GOFLAGS: "-mod=mod" });
    expect(r.code, r.stderr).toBe(0);
    const answer = r.json();
    expect(answer).toMatchObject({ run_id: "run-start", backend: "session", owner });
    expect(String(answer.next)).toContain(`${crwBin} flow next run-start`);
    const spec = readSpec(paths.spec);
    expect(spec).toMatchObject({ format: SPEC_FORMAT, backend: "session", owner, env: { TMPDIR: tmp } });
    expect(Object.keys(spec.env ?? {})).toEqual(["TMPDIR"]);
    expect(JSON.stringify(spec)).not.toContain("GOFLAGS");
    await waitFor(
      "the run process to record its started row",
      () =>
        existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
    );
    process.kill(Number(answer.pid), "SIGKILL");
  });

  it("a run's files are the user's alone: a new state directory and its flow/ are 0700 under umask 022, and a wider flow/ is narrowed with a note", async () => {
    const state = join(root, "state-modes");
    // the umask most users have: mkdir's own mode would give 0755
    const umask = process.umask(0o022);
    onTestFinished(() => {
      process.umask(umask);
    });
    const r = await crwFlow(
      [
        "start",
        workflow("run-modes"),
        "--run",
        "run-modes",
        "--state",
        state,
        "--input",
        '{"base":1}',
        "--json",
      ],
      env,
      root,
    );
    expect(r.code, r.stderr).toBe(0);
    const mode = (p: string) => (statSync(p).mode & 0o777).toString(8);
    expect(mode(state)).toBe("700");
    expect(mode(join(state, "flow"))).toBe("700");
    expect(mode(runPaths(state, "run-modes").dir)).toBe("700");
    process.kill(Number(r.json().pid), "SIGKILL");
    // a flow/ made wider (by hand, or an older crw) is narrowed at the next start, and the start says so
    chmodSync(join(state, "flow"), 0o755);
    const again = await crwFlow(
      [
        "start",
        workflow("run-modes-2"),
        "--run",
        "run-modes-2",
        "--state",
        state,
        "--input",
        '{"base":1}',
        "--json",
      ],
      env,
      root,
    );
    expect(again.code, again.stderr).toBe(0);
    expect(mode(join(state, "flow"))).toBe("700");
    expect(again.stderr).toMatch(/flow was mode 755; narrowed to 700/);
    process.kill(Number(again.json().pid), "SIGKILL");
  });

  it("S000-264 S000-265 S000-266: the run process holds process.<token>.lock (named by its started row) and the run lock; a dead one's file stays, held by nobody", async () => {
    const { r, paths } = await start("run-locks");
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor(
      "started row",
      () =>
        existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
    );
    const started = readJournalFile(paths.journal).rows.find((x) => x.type === "started");
    if (started?.type !== "started" || !started.process) throw new Error("the started row names no process");
    const lockFile = join(paths.dir, `process.${started.process}.lock`);
    expect(lockHolder(lockFile)).toMatchObject({ pid, token: started.process });
    expect(lockHolder(paths.runLock)).toMatchObject({ pid, token: started.process });
    expect(started.pid).toBe(pid);
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    expect(existsSync(lockFile)).toBe(true);
    expect(lockHolder(lockFile)).toBeNull();
    expect(lockHolder(paths.runLock)).toBeNull();
  });

  it("S000-187 S000-188: a TMPDIR that is missing or not absolute stops the start (exit 1) before the spec or a process", async () => {
    for (const bad of [join(root, "no-such-dir"), "relative/tmp"]) {
      const runId = `run-badtmp-${bad.startsWith("/") ? "missing" : "relative"}`;
      const { r, paths } = await start(runId, [], { ...env, TMPDIR: bad });
      expect(r.code).toBe(1);
      expect(r.stderr).toContain("TMPDIR");
      expect(existsSync(paths.dir)).toBe(false);
    }
  });

  it("S000-196 S000-199 S000-200 S000-201 S000-228 S000-229 S000-230 S000-056 S000-058: an owner driving the run with next --json and dispatched", async () => {
    const { r, state, paths } = await start("run-owner");
    expect(r.code, r.stderr).toBe(0);
    const seen: Array<Record<string, unknown>> = [];
    const source = cliStepSource({ cli: crwBin, runId: "run-owner", state, env });
    const kit = new ScriptedOwner({
      fake,
      owner,
      source: {
        take: async () => {
          const t = await source.take();
          seen.push(...(t.steps as unknown as Array<Record<string, unknown>>));
          return t;
        },
        report: source.report,
      },
      behave: (step) =>
        step.call === "explorer.1" && step.k === 1
          ? { kind: "answer", messages: [{ text: "I counted. n is seven", phase: "final_answer" }] }
          : {
              kind: "answer",
              messages: [
                { text: JSON.stringify({ n: step.call === "explorer.1" ? 7 : 5 }), phase: "final_answer" },
              ],
              usage: { input: 10, output: 1 },
            },
    });
    expect(await kit.untilSettled(60_000)).toBe("ended");
    const rows = readJournalFile(paths.journal).rows;
    expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "completed", result: { sum: 112 } });
    const spawn = seen.find((s) => s.action === "spawn");
    expect(spawn).toMatchObject({
      call: expect.any(String),
      k: 1,
      attempt: 1,
      op: expect.stringMatching(/\/t1$/),
      agent_id: null,
    });
    expect(spawn?.host_call).toMatchObject({ tool: "spawn_agent", arguments: { fork_context: false } });
    expect(String((spawn?.host_call as { after: string } | undefined)?.after)).toContain(
      "flow dispatched run-owner",
    );
    const send = seen.find((s) => s.action === "send_input");
    expect(send?.host_call).toMatchObject({ tool: "send_input", arguments: { target: send?.agent_id } });
    expect(String((send as { message: string }).message).split("\n")[0]).toBe(
      "crw-flow-op: explorer.1/t2-a1",
    );
    expect(kit.replies.every((x) => x.reply === "bound")).toBe(true);
    expect(readdirSync(paths.inbox).length).toBeGreaterThanOrEqual(3);
    const close = seen.find((s) => s.action === "close");
    expect(close?.host_call).toMatchObject({ tool: "close_agent" }); // S000-202
    const show = await crwFlow(["show", "run-owner", "--state", state, "--json"], env);
    expect(show.code).toBe(0);
    expect(show.json()).toMatchObject({ status: "completed", result: { sum: 112 } });
    const calls = show.json().calls as Array<{
      call: string;
      status: string;
      steps: number;
      tokens: { total?: number };
    }>;
    expect(calls.find((c) => c.call === "explorer.1")).toMatchObject({ status: "completed", steps: 2 });
    expect(calls.find((c) => c.call === "reviewer.1")?.tokens.total).toBe(11);
    const human = await crwFlow(["show", "run-owner", "--state", state], env);
    expect(human.stdout).toContain("run run-owner (cli-pair): completed");
    // S000-266: a process that ends removes its process lock file
    await waitFor("the run process to exit", () => !pidAlive(Number(r.json().pid)));
    expect(readdirSync(paths.dir).filter((f) => f.startsWith("process.") && f.endsWith(".lock"))).toEqual([]);
  });

  it("S000-231: dispatched to a run no process holds is queued and stays in the inbox; exit 1", async () => {
    const state = join(root, "state");
    const paths = runPaths(state, "run-unheld");
    mkdirSync(paths.dir, { recursive: true });
    writeSpec(paths.spec, {
      format: SPEC_FORMAT,
      run_id: "run-unheld",
      workflow: workflow("run-unheld"),
      workflow_name: "cli-pair",
      input: { base: 0 },
      backend: "session",
      owner,
      pool: 2,
      repo: root,
      host: fake.url,
      created_at: new Date().toISOString(),
    });
    const r = await crwFlow(
      [
        "dispatched",
        "run-unheld",
        "explorer.1",
        "--agent",
        "a-1",
        "--k",
        "1",
        "--attempt",
        "1",
        "--wait",
        "1",
        "--state",
        state,
        "--json",
      ],
      env,
    );
    expect(r.code).toBe(1);
    expect(r.json()).toMatchObject({ reply: "queued" });
    expect(readdirSync(paths.inbox)).toEqual(["explorer.1.t1-a1.a-1.json"]);
  });

  it("S000-007 S000-234: a resume on another backend than the started row records is refused (exit 2) before any row", async () => {
    const state = join(root, "state");
    const paths = runPaths(state, "run-mixed");
    mkdirSync(paths.dir, { recursive: true });
    writeSpec(paths.spec, {
      format: SPEC_FORMAT,
      run_id: "run-mixed",
      workflow: workflow("run-mixed"),
      workflow_name: "cli-pair",
      input: { base: 0 },
      backend: "session",
      owner,
      pool: 2,
      repo: root,
      host: fake.url,
      created_at: new Date().toISOString(),
    });
    const w = JournalWriter.create(paths.journal, "run-mixed");
    w.append([
      {
        type: "started",
        backend: "app-server",
        role_pairs: {},
        policy_digest: "sha256:x",
        process: null,
        pid: 1,
        process_n: 1,
      },
    ]);
    w.close();
    const before = readFileSync(paths.journal, "utf8");
    const r = await crwFlow(["resume", "run-mixed", "--state", state], env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("app-server");
    expect(readFileSync(paths.journal, "utf8")).toBe(before);
  });

  it("S000-245 S000-247 S000-241: resume --detach with a recorded TMPDIR that is gone exits 1 naming it; the spec is not rewritten", async () => {
    const tmp = mkdtempSync(join(root, "gone-"));
    const { r, paths, state } = await start("run-gone", [], { ...env, TMPDIR: tmp });
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor(
      "started row",
      () =>
        existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
    );
    process.kill(pid, "SIGKILL");
    await waitFor("the process to die", () => !pidAlive(pid));
    rmSync(tmp, { recursive: true });
    const specBefore = readFileSync(paths.spec, "utf8");
    const rowsBefore = readFileSync(paths.journal, "utf8");
    const res = await crwFlow(["resume", "run-gone", "--detach", "--state", state], env);
    expect(res.code).toBe(1);
    expect(res.stderr).toContain(tmp);
    const next = await crwFlow(["next", "run-gone", "--state", state, "--json"], env); // S000-246
    expect(next.json().warnings).toEqual([expect.stringContaining("its resume did not start")]);
    expect(readFileSync(paths.spec, "utf8")).toBe(specBefore);
    expect(readFileSync(paths.journal, "utf8")).toBe(rowsBefore);
  });
});
