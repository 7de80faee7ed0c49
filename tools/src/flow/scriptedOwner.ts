import { execFile } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { listStepFiles, readReply, readRunState, reportName, runPaths, writeReport } from "@crw/flow";
import type { FakeAppServer } from "../codex/index.js";

/**
 * The scripted owner: plays the owner thread of a session run against the fake app-server. Each round it
 * takes the run's steps (`crw flow next --json` as a real process, or the step files directly for
 * in-process runs and the benchmark), makes the host call on the fake host (spawn_agent, send_input,
 * close_agent), reports the dispatch (`crw flow dispatched`, or the report file), and lets the subagent
 * answer as the test's `behave` says.
 */
export interface OwnerStep {
  call: string;
  k: number;
  attempt: number;
  op: string;
  role: string;
  action: "spawn" | "send_input" | "close";
  agent_type?: string;
  model?: string | null;
  reasoning_effort?: string | null;
  message?: string;
  packet?: string;
  workspace?: string;
  agent_id: string | null;
}

/** What a subagent does with its turn: answer (messages and token usage), fail, or never end. */
export type SubagentTurn =
  | {
      kind: "answer";
      messages: Array<{ text: string; phase?: "commentary" | "final_answer" | null }>;
      usage?: { input: number; output: number; cached_input?: number; reasoning_output?: number };
    }
  | { kind: "fail"; codexErrorInfo: string; message?: string }
  | { kind: "hang" };

export type Behave = (step: OwnerStep, agentId: string) => SubagentTurn | Promise<SubagentTurn>;

export interface StepSource {
  /** The steps to take now (close steps included); `state` is the run's state. */
  take(): Promise<{ state: string; steps: OwnerStep[] }>;
  /** Reports a dispatch; answers the reply (bound, retry, …). */
  report(step: OwnerStep, agentId: string): Promise<string>;
}

export interface ScriptedOwnerOptions {
  fake: FakeAppServer;
  owner: string;
  source: StepSource;
  behave: Behave;
  /** Reported reply kinds, for assertions. */
  onReply?: (step: OwnerStep, agentId: string, reply: string) => void;
  /** Skip the dispatched report for a step (the run finds the subagent by its marker). */
  silent?: (step: OwnerStep) => boolean;
  /** Pause between rounds with no step. */
  idleMs?: number;
}

export class ScriptedOwner {
  readonly taken: OwnerStep[] = [];
  readonly replies: Array<{ op: string; attempt: number; agent: string; reply: string }> = [];
  private stopped = false;
  private loop: Promise<void> | null = null;

  constructor(private readonly o: ScriptedOwnerOptions) {}

  start(): this {
    this.loop = this.run();
    return this;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
  }

  /** Runs until the run's state is ended or paused (or stop()). Answers the last state seen. */
  async untilSettled(timeoutMs = 60_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const { state, steps } = await this.o.source.take();
      if (steps.length > 0) await this.takeSteps(steps);
      else if (state === "ended" || state === "paused" || this.stopped) return state;
      else await new Promise((r) => setTimeout(r, this.o.idleMs ?? 20));
      if (Date.now() > deadline)
        throw new Error(`the run did not settle in ${timeoutMs} ms (state ${state})`);
    }
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      const { steps } = await this.o.source.take();
      if (steps.length > 0) await this.takeSteps(steps);
      else await new Promise((r) => setTimeout(r, this.o.idleMs ?? 20));
    }
  }

  private readonly seen = new Set<string>();

  /** A step is taken once (a real owner does not spawn again for a step it took); a round always yields. */
  private async takeSteps(steps: OwnerStep[]): Promise<void> {
    const fresh = steps.filter((s) => {
      const key = `${s.action}:${s.call}:${s.k}:${s.attempt}:${s.action === "close" ? s.agent_id : ""}`;
      if (this.seen.has(key)) return false;
      this.seen.add(key);
      return true;
    });
    await Promise.all(fresh.map((s) => this.takeStep(s)));
    await new Promise((r) => setTimeout(r, this.o.idleMs ?? 20));
  }

  private async takeStep(step: OwnerStep): Promise<void> {
    const { fake } = this.o;
    this.taken.push(step);
    if (step.action === "close") {
      if (step.agent_id && fake.state.threads.has(step.agent_id)) fake.closeAgent(step.agent_id);
      return;
    }
    let agentId: string;
    if (step.action === "spawn") {
      agentId = fake.spawnSubagent({
        ownerThreadId: this.o.owner,
        message: step.message ?? "",
        model: step.model ?? null,
        reasoningEffort: step.reasoning_effort ?? null,
        agentRole: step.agent_type ?? null,
      }).threadId;
    } else {
      agentId = step.agent_id as string;
      fake.sendInput(agentId, step.message ?? "");
    }
    if (!this.o.silent?.(step)) {
      const reply = await this.o.source.report(step, agentId);
      this.replies.push({ op: step.op, attempt: step.attempt, agent: agentId, reply });
      this.o.onReply?.(step, agentId, reply);
    }
    const turn = await this.o.behave(step, agentId);
    if (turn.kind === "answer") {
      fake.completeTurn(agentId, {
        messages: turn.messages.map((m) => ({ text: m.text, phase: m.phase ?? null })),
        ...(turn.usage ? { usage: turn.usage } : {}),
      });
    } else if (turn.kind === "fail") {
      fake.failTurn(agentId, turn.codexErrorInfo, turn.message ? { message: turn.message } : {});
    }
  }
}

/** Steps through the CLI, as a real owner does: `crw flow next --json` and `crw flow dispatched`. */
export function cliStepSource(opts: {
  cli: string;
  runId: string;
  state: string;
  env?: NodeJS.ProcessEnv;
}): StepSource {
  const run = (args: string[]) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile(
        process.execPath,
        [opts.cli, "flow", ...args, "--state", opts.state, "--json"],
        { env: opts.env ?? process.env },
        (err, stdout, stderr) => {
          resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
        },
      );
    });
  return {
    async take() {
      const r = await run(["next", opts.runId]);
      if (r.code !== 0) throw new Error(`crw flow next exited ${r.code}: ${r.stderr}`);
      const answer = JSON.parse(r.stdout) as { state: string; steps: OwnerStep[] };
      return { state: answer.state, steps: answer.steps };
    },
    async report(step, agentId) {
      const r = await run([
        "dispatched",
        opts.runId,
        step.call,
        "--agent",
        agentId,
        "--k",
        String(step.k),
        "--attempt",
        String(step.attempt),
        "--wait",
        "20",
      ]);
      try {
        return (JSON.parse(r.stdout) as { reply: string }).reply;
      } catch {
        throw new Error(`crw flow dispatched exited ${r.code}: ${r.stderr}`);
      }
    },
  };
}

/** Steps straight from the run's files (in-process runs, the benchmark): what `next` and `dispatched` do. */
export function fileStepSource(opts: { state: string; runId: string; replyWaitMs?: number }): StepSource {
  const paths = runPaths(opts.state, opts.runId);
  return {
    async take() {
      const listed = listStepFiles(paths.steps);
      const state = readRunState(paths, listed.steps.length > 0).kind;
      const steps: OwnerStep[] = [];
      for (const c of listed.closes) {
        rmSync(c.path, { force: true });
        steps.push({
          call: c.call,
          k: 0,
          attempt: c.attempt,
          op: `${c.call}/close`,
          role: "",
          action: "close",
          agent_id: c.agent_id,
        });
      }
      for (const s of listed.steps) steps.push({ ...s });
      return { state, steps };
    },
    async report(step, agentId) {
      const name = reportName(step.call, step.k, step.attempt, agentId);
      rmSync(join(paths.replies, name), { force: true });
      writeReport(paths.inbox, {
        format: "crw-flow-dispatch/1",
        run_id: opts.runId,
        call: step.call,
        k: step.k,
        attempt: step.attempt,
        agent_id: agentId,
        at: new Date().toISOString(),
      });
      const deadline = Date.now() + (opts.replyWaitMs ?? 20_000);
      while (Date.now() < deadline) {
        const reply = readReply(paths.replies, name);
        if (reply) return reply.reply;
        await new Promise((r) => setTimeout(r, 10));
      }
      return "queued";
    },
  };
}
