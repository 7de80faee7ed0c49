import { execFile } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  watch,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import {
  dirFrom,
  JournalWriter,
  listStepFiles,
  lockHolder,
  pidAlive,
  readJournalFile,
  readSpec,
  reportName,
  runPaths,
  SPEC_FORMAT,
  tryLock,
  unlock,
  writeSpec,
} from "@crw/flow";
import type { FakeAppServer } from "@crw/tools/codex";
import { type OwnerStep, ScriptedOwner } from "@crw/tools/flow";
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from "vitest";
import { bindingFile } from "../src/bound/index.js";
import { dispatchedCommand } from "../src/cli/dispatched.js";
import { crwBin, crwFlow, dispatchedArgs, ownerSession, waitFor } from "./helpers/cli.js";

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

/** Runs a command line as the owner would paste it (the test's paths hold no spaces). */
function runCommand(
  line: string,
  e: NodeJS.ProcessEnv,
): Promise<{ code: number; stdout: string; stderr: string; json: () => unknown }> {
  const [file, ...args] = line.split(" ");
  return new Promise((done) => {
    execFile(String(file), args, { env: e, cwd: root }, (err, stdout, stderr) => {
      const code = err ? Number((err as { code?: number }).code ?? 1) : 0;
      done({ code, stdout, stderr, json: () => JSON.parse(stdout) });
    });
  });
}

function workflow(name: string, extra = ""): string {
  const path = join(root, `${name}.mjs`);
  writeFileSync(path, workflowSource(extra));
  return path;
}

/** A session run that has its spec and nothing else: no process, no journal. */
function specOnly(runId: string) {
  const state = join(root, "state");
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  writeSpec(paths.spec, {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: workflow(runId),
    workflow_name: "cli-pair",
    input: { base: 0 },
    backend: "session",
    owner,
    pool: 2,
    repo: root,
    host: fake.url,
    created_at: new Date().toISOString(),
  });
  return { state, paths };
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
  describe("crw flow start from an owner thread, by default and with --backend app-server", () => {
    let tmp: string;
    let answer: Record<string, unknown>;
    let spec: ReturnType<typeof readSpec>;
    let specText: string;
    let appServer: { code: number; answer: Record<string, unknown>; spec: ReturnType<typeof readSpec> };
    let started: boolean;

    beforeAll(async () => {
      tmp = `${mkdtempSync(join(root, "tmp-"))}/`; // as written: the trailing slash stays
      const { r, paths } = await start("run-start", [], {
        ...env,
        TMPDIR: tmp,
        GOFLAGS: "-mod=mod",
        GOTOOLCHAIN: "go1.0-never",
      });
      expect(r.code, r.stderr).toBe(0);
      answer = r.json();
      spec = readSpec(paths.spec);
      specText = readFileSync(paths.spec, "utf8");
      await waitFor(
        "the run process to record its started row",
        () =>
          existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
      );
      started = readJournalFile(paths.journal).rows.some(
        (x) => x.type === "started" && x.backend === "session",
      );
      process.kill(Number(answer.pid), "SIGKILL");
      // no TMPDIR at all: the platform default is recorded
      const { TMPDIR: _none, ...bare } = env;
      const other = await start("run-start-app-server", ["--backend", "app-server"], bare);
      expect(other.r.code, other.r.stderr).toBe(0);
      appServer = { code: other.r.code, answer: other.r.json(), spec: readSpec(other.paths.spec) };
      process.kill(Number(appServer.answer.pid), "SIGKILL");
    }, 60_000);

    it("starts a session run when no --backend is given, and an app-server run with --backend app-server (S000-180)", () => {
      expect(answer).toMatchObject({ run_id: "run-start", backend: "session", owner });
      expect(started).toBe(true);
      expect(appServer.answer).toMatchObject({ run_id: "run-start-app-server", backend: "app-server" });
    });

    it("the spec records the backend (S000-182)", () => {
      expect(spec.backend).toBe("session");
      expect(appServer.spec.backend).toBe("app-server");
    });

    it("run.json is crw-flow-run/1 with env.TMPDIR; a spec without the member reads as before (S000-183)", () => {
      expect(SPEC_FORMAT).toBe("crw-flow-run/1");
      expect(spec).toMatchObject({ format: "crw-flow-run/1", owner, env: { TMPDIR: tmp } });
      const legacyPaths = runPaths(join(root, "state-legacy"), "legacy");
      mkdirSync(legacyPaths.dir, { recursive: true });
      const { env: _dropped, ...legacy } = spec;
      writeSpec(legacyPaths.spec, { ...legacy, run_id: "legacy" });
      const read = readSpec(legacyPaths.spec);
      expect(read).not.toHaveProperty("env");
      expect(read).toEqual({ ...legacy, run_id: "legacy" });
    });

    it("env.TMPDIR is what tmploc answers for the starting environment: as written, and the platform default without one (S000-184)", () => {
      expect(spec.env?.TMPDIR).toBe(tmp);
      expect(dirFrom({ TMPDIR: tmp })).toMatchObject({ ok: true, dir: tmp, defaulted: false });
      const fallback = dirFrom({});
      expect(fallback).toMatchObject({ ok: true, defaulted: true });
      expect(appServer.spec.env).toEqual({ TMPDIR: fallback.dir });
    });

    it("no other variable of the caller's environment is recorded: no PATH, GOFLAGS or GOTOOLCHAIN (S000-186)", () => {
      expect(Object.keys(spec.env ?? {})).toEqual(["TMPDIR"]);
      expect(specText).not.toContain("GOFLAGS");
      expect(specText).not.toContain("-mod=mod");
      expect(specText).not.toContain("GOTOOLCHAIN");
      expect(specText).not.toContain("go1.0-never");
      expect(specText).not.toContain(String(env.PATH));
    });

    it("the start's answer names crw flow next for the run", () => {
      expect(String(answer.next)).toContain(`${crwBin} flow next run-start`);
    });
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

  describe("a run process's locks", () => {
    let pid: number;
    let started: Extract<ReturnType<typeof readJournalFile>["rows"][number], { type: "started" }>;
    let lockFile: string;
    let held: { process: unknown; run: unknown };
    let afterKill: { exists: boolean; process: unknown; run: unknown };
    /** The resumed process's lock files as the run directory saw them taken and let go, in order. */
    let order: string[];
    let resumedToken: string;

    beforeAll(async () => {
      const { r, paths, state } = await start("run-locks");
      expect(r.code, r.stderr).toBe(0);
      pid = Number(r.json().pid);
      const startedRow = () =>
        existsSync(paths.journal)
          ? readJournalFile(paths.journal).rows.filter((x) => x.type === "started")
          : [];
      await waitFor("started row", () => startedRow().length === 1);
      const first = startedRow()[0];
      if (first?.type !== "started" || !first.process) throw new Error("the started row names no process");
      started = first;
      lockFile = join(paths.dir, `process.${started.process}.lock`);
      held = { process: lockHolder(lockFile), run: lockHolder(paths.runLock) };
      process.kill(pid, "SIGKILL");
      await waitFor("the process to die", () => !pidAlive(pid));
      afterKill = {
        exists: existsSync(lockFile),
        process: lockHolder(lockFile),
        run: lockHolder(paths.runLock),
      };
      // the resumed process is watched from before it starts until it has ended
      const seen: string[] = [];
      const watcher = watch(paths.dir, (event, name) => {
        if (event === "rename" && name && /^(process\..*\.lock|run\.lock)$/.test(String(name)))
          seen.push(String(name));
      });
      try {
        const resumed = await crwFlow(["resume", "run-locks", "--detach", "--state", state, "--json"], env);
        expect(resumed.code, resumed.stderr).toBe(0);
        const pid2 = Number(resumed.json().resumed_pid);
        await waitFor("the resumed process's started row", () => startedRow().length === 2);
        const second = startedRow()[1];
        resumedToken = second?.type === "started" ? String(second.process) : "";
        const cancel = await crwFlow(
          ["cancel", "run-locks", "--state", state, "--wait", "20", "--json"],
          env,
        );
        expect(cancel.code, cancel.stderr).toBe(0);
        await waitFor("the resumed process to end", () => !pidAlive(pid2));
        // the last events may still be on their way from the watch
        await waitFor(
          "the process lock let go",
          () =>
            seen.includes(`process.${resumedToken}.lock`) &&
            seen.filter((n) => n === `process.${resumedToken}.lock`).length === 2,
        );
      } finally {
        watcher.close();
      }
      order = seen.filter((n) => n === "run.lock" || n === `process.${resumedToken}.lock`);
    }, 60_000);

    it("the run process holds process.<token>.lock from before it takes the run lock until after it lets it go (S000-264)", () => {
      expect(held.process).toMatchObject({ pid });
      expect(held.run).toMatchObject({ pid });
      const own = `process.${resumedToken}.lock`;
      // taken first (its creation), let go last (its removal); every change of run.lock falls between
      expect(order.at(0)).toBe(own);
      expect(order.at(-1)).toBe(own);
      expect(order.filter((n) => n === own)).toHaveLength(2);
      expect(order.filter((n) => n === "run.lock").length).toBeGreaterThanOrEqual(2);
    });

    it("the started row names the process lock's token as process (S000-265 S000-210)", () => {
      expect(started.pid).toBe(pid);
      expect(held.process).toMatchObject({ token: started.process });
      expect(held.run).toMatchObject({ token: started.process });
    });

    it("a killed process's lock file stays, held by nobody (S000-266)", () => {
      expect(afterKill).toEqual({ exists: true, process: null, run: null });
    });
  });

  describe("a start whose TMPDIR cannot be used", () => {
    const bad: Record<string, { code: number; stderr: string; dirMade: boolean; bindingSame: boolean }> = {};
    let notDir: string;

    beforeAll(async () => {
      notDir = join(root, "tmp-is-a-file");
      writeFileSync(notDir, "");
      const binding = () => {
        const f = bindingFile(join(root, "state"), owner);
        return existsSync(f) ? readFileSync(f, "utf8") : null;
      };
      const cases: Record<string, string> = {
        missing: join(root, "no-such-dir"),
        relative: "relative/tmp",
        "not-a-directory": notDir,
      };
      for (const [kind, dir] of Object.entries(cases)) {
        const before = binding();
        const { r, paths } = await start(`run-badtmp-${kind}`, [], { ...env, TMPDIR: dir });
        bad[kind] = {
          code: r.code,
          stderr: r.stderr,
          dirMade: existsSync(paths.dir),
          bindingSame: binding() === before,
        };
      }
    }, 60_000);

    it("a TMPDIR that is missing, not absolute or not a directory stops the start with exit 1 and tmploc's reason (S000-187)", () => {
      expect(bad.missing).toMatchObject({ code: 1, stderr: expect.stringContaining("does not exist") });
      expect(bad.relative).toMatchObject({
        code: 1,
        stderr: expect.stringContaining("'relative/tmp' is not an absolute path"),
      });
      expect(bad["not-a-directory"]).toMatchObject({
        code: 1,
        stderr: expect.stringContaining(`'${notDir}' is not a directory`),
      });
    });

    it("the refusal comes before the spec is written, before any process starts and before the owner is bound (S000-188)", () => {
      // no run directory: no spec and no process (a run process's locks live there); the owner's line unchanged
      for (const kind of Object.keys(bad))
        expect(bad[kind], kind).toMatchObject({ dirMade: false, bindingSame: true });
    });
  });

  describe("an owner driving a run with next --json and dispatched", () => {
    type Answer = Record<string, unknown>;
    interface Dispatch {
      step: { call: string; k: number; attempt: number; action: string };
      agent: string;
      code: number;
      reply: Answer;
      ms: number;
      /** The call's rows naming the agent when the reply was read. */
      rowsAtReply: Array<Record<string, unknown>>;
    }
    let r: Awaited<ReturnType<typeof start>>["r"];
    let state: string;
    let paths: ReturnType<typeof runPaths>;
    const seen: Array<Record<string, unknown>> = [];
    let takes = 0;
    const dispatches: Dispatch[] = [];
    const others: Record<string, Dispatch> = {};
    const inboxEvents: Array<{ event: string; name: string }> = [];
    let rows: ReturnType<typeof readJournalFile>["rows"];
    let lockFilesAtEnd: string[];

    const dispatched = async (
      step: { call: string; k: number; attempt: number; action: string },
      agent: string,
      wait = "20",
    ): Promise<Dispatch> => {
      const t0 = Date.now();
      const res = await crwFlow(dispatchedArgs("run-owner", step, agent, state, ["--wait", wait]), env);
      const ms = Date.now() - t0;
      const rowsAtReply = readJournalFile(paths.journal).rows.filter(
        (x) =>
          ("thread_id" in x && x.thread_id === agent) || (x.type === "turn_started" && x.call === step.call),
      ) as unknown as Array<Record<string, unknown>>;
      return { step, agent, code: res.code, reply: res.json(), ms, rowsAtReply };
    };

    beforeAll(async () => {
      ({ r, state, paths } = await start("run-owner"));
      expect(r.code, r.stderr).toBe(0);
      await waitFor("the run's inbox", () => existsSync(paths.inbox));
      const watcher = watch(paths.inbox, (event, name) => {
        if (name) inboxEvents.push({ event, name: String(name) });
      });
      let strays = false;
      const kit = new ScriptedOwner({
        fake,
        owner,
        source: {
          take: async () => {
            // the owner takes its steps with the very command the start's answer named
            const res = await runCommand(String(r.json().next), env);
            takes++;
            if (res.code !== 0) throw new Error(`${r.json().next} exited ${res.code}: ${res.stderr}`);
            const a = res.json() as { state: string; steps: OwnerStep[] };
            seen.push(...(a.steps as unknown as Array<Record<string, unknown>>));
            const spawn = a.steps.find((x) => x.action === "spawn");
            if (spawn && !strays) {
              strays = true;
              // before the step has a subagent: replies other than bound, each for a step of this run
              const noMarker = fake.spawnSubagent({
                ownerThreadId: owner,
                message: "hello",
                agentRole: "explorer",
              });
              others.retry = await dispatched(spawn, noMarker.threadId);
              const stranger = fake.createOwnerThread();
              fake.startOwnerTurn(stranger);
              const foreign = fake.spawnSubagent({ ownerThreadId: stranger, message: String(spawn.message) });
              others.refused = await dispatched(spawn, foreign.threadId);
              others.close = await dispatched({ ...spawn, k: 9 }, noMarker.threadId);
            }
            return { state: a.state, steps: a.steps };
          },
          report: async (step, agent) => {
            const d = await dispatched(step, agent);
            dispatches.push(d);
            return String(d.reply.reply);
          },
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
      try {
        expect(await kit.untilSettled(60_000)).toBe("ended");
      } finally {
        watcher.close();
      }
      rows = readJournalFile(paths.journal).rows;
      await waitFor("the run process to exit", () => !pidAlive(Number(r.json().pid)));
      lockFilesAtEnd = readdirSync(paths.dir).filter((f) => f.startsWith("process.") && f.endsWith(".lock"));
      // no process holds the run now: the report waits its --wait out and is queued
      const step = dispatches[0]?.step ?? { call: "explorer.1", k: 1, attempt: 1, action: "spawn" };
      others.queued = await dispatched(step, "agent-late", "1");
    }, 120_000);

    it("the run ends with the owner's answers", () => {
      expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "completed", result: { sum: 112 } });
    });

    it("the start's answer names next as the command the steps are taken with: the owner ran it for every step (S000-193)", () => {
      expect(r.json().next).toBe(
        `${process.execPath} ${crwBin} flow next run-owner --state ${state} --wait 10 --json`,
      );
      expect(takes).toBeGreaterThan(0);
      expect(seen.filter((x) => x.action !== "close").length).toBeGreaterThanOrEqual(3);
    });

    it("each step next hands out carries call, k, attempt, op, role, action, agent_type, model, reasoning_effort, message, packet, workspace and agent_id (S000-199)", () => {
      const keys = [
        "call",
        "k",
        "attempt",
        "op",
        "role",
        "action",
        "agent_type",
        "model",
        "reasoning_effort",
        "message",
        "packet",
        "workspace",
        "agent_id",
      ];
      const work = seen.filter((x) => x.action !== "close");
      expect(work.length).toBeGreaterThanOrEqual(3);
      for (const step of work) for (const k of keys) expect(step, k).toHaveProperty(k);
      expect(work.find((x) => x.action === "spawn")).toMatchObject({
        call: expect.any(String),
        k: 1,
        attempt: 1,
        op: expect.stringMatching(/\/t1$/),
        agent_id: null,
      });
    });

    it("a spawn step's host call is spawn_agent, then crw flow dispatched naming the step (S000-200)", () => {
      const spawn = seen.find((x) => x.action === "spawn");
      expect(spawn?.host_call).toMatchObject({
        tool: "spawn_agent",
        arguments: { agent_type: spawn?.agent_type, message: spawn?.message, fork_context: false },
      });
      expect(String((spawn?.host_call as { after: string } | undefined)?.after)).toContain(
        `flow dispatched run-owner ${spawn?.call} --agent <agent_id from spawn_agent> --k 1 --attempt 1`,
      );
    });

    it("a send_input step's host call is send_input(target, message), then crw flow dispatched for that agent (S000-201)", () => {
      const send = seen.find((x) => x.action === "send_input");
      expect(send?.host_call).toMatchObject({
        tool: "send_input",
        arguments: { target: send?.agent_id, message: send?.message },
      });
      expect(String((send as { message: string }).message).split("\n")[0]).toBe(
        "crw-flow-op: explorer.1/t2-a1",
      );
      expect(String((send?.host_call as { after: string } | undefined)?.after)).toContain(
        `flow dispatched run-owner explorer.1 --agent ${send?.agent_id} --k 2 --attempt 1`,
      );
    });

    it("dispatched puts the report in the inbox under a temporary name and renames it into place (S000-228)", () => {
      const finals = new Set(readdirSync(paths.inbox));
      expect(dispatches.length).toBeGreaterThanOrEqual(3);
      for (const d of dispatches) {
        const name = reportName(d.step.call, d.step.k, d.step.attempt, d.agent);
        expect(finals.has(name)).toBe(true);
        // the report appears whole: its own name is only ever renamed in, never written to
        expect(inboxEvents.filter((e) => e.name === name).map((e) => e.event)).toContain("rename");
        expect(inboxEvents.some((e) => e.name === name && e.event === "change")).toBe(false);
      }
      const temporary = inboxEvents.filter((e) => !finals.has(e.name));
      expect(temporary.some((e) => e.event === "change")).toBe(true);
    });

    it("dispatched waits for the run's reply and prints it as JSON; a report to a run that ended is queued", () => {
      for (const d of dispatches) expect(d.reply).toMatchObject({ reply: "bound", run_id: "run-owner" });
      expect(others.queued?.reply).toMatchObject({ reply: "queued" });
    });

    it("dispatched exits 0 on bound and 1 on every other reply: retry, refused, close, queued (S000-230)", () => {
      expect(dispatches.map((d) => d.code)).toEqual(dispatches.map(() => 0));
      expect(
        Object.fromEntries(Object.entries(others).map(([k, d]) => [k, [d.reply.reply, d.code]])),
      ).toEqual({
        retry: ["retry", 1],
        refused: ["refused", 1],
        close: ["close", 1],
        queued: ["queued", 1],
      });
    });

    it("the owner reports each spawn with a report in inbox/ and reads the run's answer from replies/ under the same name (S000-056)", () => {
      for (const d of dispatches) {
        const name = reportName(d.step.call, d.step.k, d.step.attempt, d.agent);
        expect(JSON.parse(readFileSync(join(paths.inbox, name), "utf8"))).toMatchObject({
          run_id: "run-owner",
          call: d.step.call,
          k: d.step.k,
          attempt: d.step.attempt,
          agent_id: d.agent,
        });
        expect(JSON.parse(readFileSync(join(paths.replies, name), "utf8"))).toMatchObject({ reply: "bound" });
      }
    });

    it("a bound reply comes once the subagent is the step's and its rows are written (S000-058)", () => {
      for (const d of dispatches.filter((x) => x.step.action === "spawn")) {
        expect(d.rowsAtReply).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ type: "thread_started", call: d.step.call, thread_id: d.agent }),
          ]),
        );
      }
      for (const d of dispatches) {
        expect(d.rowsAtReply).toEqual(
          expect.arrayContaining([
            expect.objectContaining({
              type: "turn_started",
              call: d.step.call,
              k: d.step.k,
              attempt: d.step.attempt,
            }),
          ]),
        );
      }
      // the replies that bind nothing wrote no row for their agents
      expect(
        others.retry?.rowsAtReply.filter(
          (x) => x.type === "thread_started" && x.thread_id === others.retry?.agent,
        ),
      ).toEqual([]);
    });

    it("close steps go to close_agent; show reports the calls, their steps and tokens", async () => {
      const close = seen.find((x) => x.action === "close");
      expect(close?.host_call).toMatchObject({ tool: "close_agent" });
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
    });

    it("a process that ends removes its process lock file (S000-266)", () => {
      expect(lockFilesAtEnd).toEqual([]);
    });
  });

  it("a bound reply is written only once the bind rows are durable: a process killed right after them has answered nothing (S000-058)", async () => {
    // an owner thread of its own: a subagent another test's run left on the shared owner is no candidate
    const own = { ...env, CODEX_THREAD_ID: fake.createOwnerThread({ cwd: root }) };
    const { r, state, paths } = await start("run-bind-crash", [], {
      ...own,
      CRW_FLOW_FAULT: "after:turn_started:1",
    });
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    const next = await crwFlow(["next", "run-bind-crash", "--state", state, "--wait", "10", "--json"], own);
    const step = (next.json().steps as OwnerStep[]).find((x) => x.action === "spawn");
    if (!step?.message) throw new Error("no spawn step");
    const agent = fake.spawnSubagent({
      ownerThreadId: own.CODEX_THREAD_ID,
      message: step.message,
      agentRole: step.agent_type,
    });
    const d = await crwFlow(
      dispatchedArgs("run-bind-crash", step, agent.threadId, state, ["--wait", "20"]),
      own,
    );
    await waitFor("the run process to die at its bind rows", () => !pidAlive(pid));
    const rows = readJournalFile(paths.journal).rows;
    expect(rows.at(-1)).toMatchObject({ type: "turn_started", call: step.call });
    expect(rows.find((x) => x.type === "thread_started")).toMatchObject({ thread_id: agent.threadId });
    // the process died between its durable rows and the reply: no reply was ever written
    expect(existsSync(join(paths.replies, reportName(step.call, step.k, step.attempt, agent.threadId)))).toBe(
      false,
    );
    expect(d.json()).toMatchObject({ reply: "queued" });
  });

  it("dispatched to a run no process holds is queued and stays in the inbox; exit 1 (S000-231)", async () => {
    const { state, paths } = specOnly("run-unheld");
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

  it("a queued report stays in the inbox, and the resumed run answers it at its step: bound (S000-231)", async () => {
    const { r, state, paths } = await start("run-queued");
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    const step = await waitFor("a step file", () => listStepFiles(paths.steps).steps[0]);
    // the run's process dies with the step out: nobody holds the run when the owner reports
    process.kill(pid, "SIGKILL");
    await waitFor("the run process to die", () => !pidAlive(pid));
    const agent = fake.spawnSubagent({
      ownerThreadId: owner,
      message: step.message,
      agentRole: step.agent_type,
    });
    const name = reportName(step.call, step.k, step.attempt, agent.threadId);
    const queued = await crwFlow(
      dispatchedArgs("run-queued", step, agent.threadId, state, ["--wait", "1"]),
      env,
    );
    expect(queued.code).toBe(1);
    expect(queued.json()).toMatchObject({ reply: "queued" });
    expect(readdirSync(paths.inbox)).toEqual([name]);
    expect(existsSync(join(paths.replies, name))).toBe(false);
    const resumed = await crwFlow(["resume", "run-queued", "--detach", "--state", state, "--json"], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    const pid2 = Number(resumed.json().resumed_pid);
    onTestFinished(() => {
      if (pidAlive(pid2)) process.kill(pid2, "SIGKILL");
    });
    // nobody reports again: the resumed process reads the waiting report and answers it
    const reply = await waitFor("the resumed run's reply", () =>
      existsSync(join(paths.replies, name))
        ? JSON.parse(readFileSync(join(paths.replies, name), "utf8"))
        : null,
    );
    expect(reply).toMatchObject({ reply: "bound", agent_id: agent.threadId });
    expect(readJournalFile(paths.journal).rows.find((x) => x.type === "thread_started")).toMatchObject({
      call: step.call,
      thread_id: agent.threadId,
    });
  });

  it("a resume on another backend than the started row records is refused (exit 2) before any row (S000-007 S000-234)", async () => {
    const { state, paths } = specOnly("run-mixed");
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

  describe("a run whose recorded TMPDIR cannot be used any more", () => {
    let tmp: string;
    let state: string;
    let paths: ReturnType<typeof runPaths>;
    let specBefore: string;
    let rowsBefore: string;
    const refused: Record<string, { code: number; stderr: string }> = {};
    let nextWarnings: unknown;
    let unchanged: { spec: boolean; rows: boolean; dirStillFile: boolean };
    let remedied: { code: number; pid: number; started: boolean };

    beforeAll(async () => {
      tmp = mkdtempSync(join(root, "gone-"));
      const started = await start("run-gone", [], { ...env, TMPDIR: tmp });
      expect(started.r.code, started.r.stderr).toBe(0);
      ({ paths, state } = started);
      const pid = Number(started.r.json().pid);
      const startedRows = () => readJournalFile(paths.journal).rows.filter((x) => x.type === "started");
      await waitFor("started row", () => existsSync(paths.journal) && startedRows().length === 1);
      process.kill(pid, "SIGKILL");
      await waitFor("the process to die", () => !pidAlive(pid));
      specBefore = readFileSync(paths.spec, "utf8");
      rowsBefore = readFileSync(paths.journal, "utf8");
      rmSync(tmp, { recursive: true });
      const resume = () => crwFlow(["resume", "run-gone", "--detach", "--state", state, "--json"], env);
      const gone = await resume();
      refused.missing = { code: gone.code, stderr: gone.stderr };
      const next = await crwFlow(["next", "run-gone", "--state", state, "--json"], env);
      nextWarnings = next.json().warnings;
      // a file where the directory was
      writeFileSync(tmp, "");
      const file = await resume();
      refused.file = { code: file.code, stderr: file.stderr };
      unchanged = {
        spec: readFileSync(paths.spec, "utf8") === specBefore,
        rows: readFileSync(paths.journal, "utf8") === rowsBefore,
        dirStillFile: statSync(tmp).isFile(),
      };
      // the remedy: the directory made again; the same spec resumes
      rmSync(tmp);
      mkdirSync(tmp);
      const again = await resume();
      const pid2 = again.code === 0 ? Number(again.json().resumed_pid) : 0;
      if (pid2) {
        await waitFor("the resumed process's started row", () => startedRows().length === 2);
        process.kill(pid2, "SIGKILL");
      }
      remedied = { code: again.code, pid: pid2, started: startedRows().length === 2 };
    }, 60_000);

    it("resume --detach with a recorded TMPDIR that is gone exits 1 naming the directory (S000-245)", () => {
      expect(refused.missing?.code).toBe(1);
      expect(refused.missing?.stderr).toContain(tmp);
    });

    it("a recorded TMPDIR that is missing or not a directory is refused before anything of the run changes (S000-241)", () => {
      expect(refused.missing).toMatchObject({ code: 1, stderr: expect.stringContaining("does not exist") });
      expect(refused.file).toMatchObject({ code: 1, stderr: expect.stringContaining("is not a directory") });
      expect(unchanged).toMatchObject({ rows: true, dirStillFile: true });
    });

    it("the spec is never rewritten for an unusable TMPDIR; making the directory again is the remedy (S000-247)", () => {
      expect(unchanged.spec).toBe(true);
      expect(readSpec(paths.spec).env).toEqual({ TMPDIR: tmp });
      expect(remedied).toMatchObject({ code: 0, started: true });
    });

    it("next with an unusable recorded TMPDIR resumes nothing and warns that its resume did not start, with the reason (S000-246)", () => {
      expect(nextWarnings).toEqual([
        expect.stringMatching(new RegExp(`its resume did not start: TMPDIR '${tmp}' does not exist`)),
      ]);
      // nothing resumed: no started row was added (checked after next, before the remedy)
      expect(unchanged.rows).toBe(true);
    });
  });
});

describe("dispatched's wait for the run's reply", () => {
  it("waits --wait S seconds for a held run that gives no reply, then answers queued; without --wait it waits longer (S000-229)", async () => {
    const { r, paths, state } = await start("run-wait");
    expect(r.code, r.stderr).toBe(0);
    const pid = Number(r.json().pid);
    await waitFor(
      "started row",
      () =>
        existsSync(paths.journal) && readJournalFile(paths.journal).rows.some((x) => x.type === "started"),
    );
    // Stopped, the run's process still holds the run but answers nothing.
    process.kill(pid, "SIGSTOP");
    onTestFinished(() => {
      if (!pidAlive(pid)) return;
      process.kill(pid, "SIGCONT");
      process.kill(pid, "SIGKILL");
    });
    const step = { call: "explorer.1", k: 1, attempt: 1 };
    const dispatch = (agent: string, wait: string[]) =>
      crwFlow(dispatchedArgs("run-wait", step, agent, state, wait), env, root);
    // The three reports wait side by side: each bound is timed from its own command's start, and the
    // unbounded one's window below runs from its start too, past both bounds.
    const unbounded = dispatch("agent-default", []);
    const window = new Promise((res) => setTimeout(res, 4_000, "waiting"));
    await Promise.all(
      [1, 2].map(async (seconds) => {
        const t0 = performance.now();
        const d = await dispatch(`agent-${seconds}`, ["--wait", String(seconds)]);
        const took = performance.now() - t0;
        expect(d.code).toBe(1);
        expect(d.json()).toMatchObject({ reply: "queued", agent_id: `agent-${seconds}` });
        expect(took).toBeGreaterThanOrEqual(seconds * 1000);
        // the bound, plus a command's start and the last poll of the reply
        expect(took).toBeLessThan(seconds * 1000 + 5_000);
      }),
    );
    // No --wait: still waiting well past both bounds; it answers queued once no process holds the run.
    const early = await Promise.race([unbounded, window]);
    expect(early).toBe("waiting");
    process.kill(pid, "SIGKILL");
    const d = await unbounded;
    expect(d.code).toBe(1);
    expect(d.json()).toMatchObject({ reply: "queued", agent_id: "agent-default" });
  }, 60_000);
});

describe("dispatched's default wait", () => {
  it("without --wait, dispatched waits 120 seconds for a held run's reply, then answers queued (S000-229)", async () => {
    const { state, paths } = specOnly("run-default-wait");
    // this process holds the run, as a run process that answers nothing would
    expect(tryLock(paths.runLock)).toBe(true);
    onTestFinished(() => unlock(paths.runLock));
    const out: string[] = [];
    const write = vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
      out.push(String(chunk));
      return true;
    });
    vi.useFakeTimers({ toFake: ["Date", "setTimeout", "clearTimeout"] });
    onTestFinished(() => {
      vi.useRealTimers();
      write.mockRestore();
    });
    let code: number | null = null;
    // the command's own arguments, after its name
    const args = dispatchedArgs(
      "run-default-wait",
      { call: "explorer.1", k: 1, attempt: 1 },
      "agent-d",
      state,
    );
    const done = dispatchedCommand(args.slice(1)).then((c) => {
      code = c;
    });
    await vi.advanceTimersByTimeAsync(119_500);
    expect(code).toBeNull();
    await vi.advanceTimersByTimeAsync(1_000);
    await done;
    expect(code).toBe(1);
    expect(JSON.parse(out.join(""))).toMatchObject({ reply: "queued", agent_id: "agent-d" });
  });
});

describe("a session run from its owner thread, with the commands alone", () => {
  it("is started, stepped and, after its process is killed, resumed by next, each command reading the run's directory (S000-178)", async () => {
    const { r, state, paths } = await start("run-driven");
    expect(r.code, r.stderr).toBe(0);
    const firstPid = Number(r.json().pid);
    const resumed: number[] = [];
    let killed = false;
    const kit = new ScriptedOwner({
      fake,
      owner,
      source: {
        take: async () => {
          const res = await crwFlow(["next", "run-driven", "--state", state, "--json"], env);
          if (res.code !== 0) throw new Error(`crw flow next exited ${res.code}: ${res.stderr}`);
          const a = res.json() as { state: string; steps: OwnerStep[]; resumed_pid?: number };
          if (a.resumed_pid !== undefined) resumed.push(a.resumed_pid);
          return { state: a.state, steps: a.steps };
        },
        report: async (step, agent) => {
          const res = await crwFlow(dispatchedArgs("run-driven", step, agent, state, ["--wait", "20"]), env);
          const reply = String(res.json().reply);
          if (reply === "bound" && !killed) {
            // Half-way: the run's process dies with a bound call; the owner's next command must resume it.
            killed = true;
            process.kill(firstPid, "SIGKILL");
            await waitFor("the run process to die", () => !pidAlive(firstPid));
          }
          return reply;
        },
      },
      behave: (step) => ({
        kind: "answer",
        messages: [
          { text: JSON.stringify({ n: step.call === "explorer.1" ? 7 : 5 }), phase: "final_answer" },
        ],
      }),
    });
    expect(await kit.untilSettled(60_000)).toBe("ended");
    expect(killed).toBe(true);
    const rows = readJournalFile(paths.journal).rows;
    expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "completed", result: { sum: 112 } });
    // Two processes held the run: the one start launched, then the one next launched.
    const started = rows.filter((x) => x.type === "started") as Array<{ pid: number }>;
    expect(started.map((x) => x.pid)).toEqual([firstPid, resumed[0]]);
    expect(resumed).toHaveLength(1);
  }, 90_000);
});
