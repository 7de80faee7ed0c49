import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createAppServerHost,
  defineWorkflow,
  executeRun,
  type FlowEvent,
  type FlowRunOutcome,
  type JournalRow,
  type RunPaths,
  type RunSpec,
  readJournalFile,
  runPaths,
  SPEC_FORMAT,
  type Workflow,
  writeSpec,
} from "@crw/flow";
import { FakeAppServer } from "@crw/tools/codex";
import { type Behave, fileStepSource, ScriptedOwner } from "@crw/tools/flow";

/** A run of a workflow in this process against the fake app-server (real JSON-RPC over ws). */
export interface InProcessRun {
  fake: FakeAppServer;
  owner: string;
  paths: RunPaths;
  spec: RunSpec;
  root: string;
  rows(): JournalRow[];
  execute(
    workflow: Workflow,
    behave: Behave,
    opts?: { silent?: (s: { op: string }) => boolean },
  ): Promise<{
    outcome: FlowRunOutcome;
    ownerKit: ScriptedOwner;
    events: FlowEvent[];
  }>;
  close(): Promise<void>;
}

export async function inProcessRun(
  options: { runId?: string; pollMs?: number; lostAfterMs?: number; input?: unknown; pool?: number } = {},
): Promise<InProcessRun> {
  const root = mkdtempSync(join(tmpdir(), "crw-flow-test-"));
  const state = join(root, "state");
  const repo = join(root, "repo");
  mkdirSync(repo, { recursive: true });
  const fake = await FakeAppServer.start();
  const owner = fake.createOwnerThread({ cwd: repo });
  fake.startOwnerTurn(owner);
  const runId = options.runId ?? "run-1";
  const paths = runPaths(state, runId);
  mkdirSync(paths.dir, { recursive: true });
  const spec: RunSpec = {
    format: SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "inline.mjs"),
    workflow_name: "inline",
    input: options.input ?? null,
    backend: "session",
    owner,
    pool: options.pool ?? 4,
    repo,
    host: fake.url,
    created_at: new Date().toISOString(),
    env: { TMPDIR: tmpdir() },
    poll_ms: options.pollMs ?? 20,
    lost_after_ms: options.lostAfterMs ?? 2_000,
  };
  writeSpec(paths.spec, spec);
  const host = createAppServerHost({ transport: fake.url });
  return {
    fake,
    owner,
    paths,
    spec,
    root,
    rows: () => readJournalFile(paths.journal).rows,
    async execute(workflow, behave, opts = {}) {
      const events: FlowEvent[] = [];
      const ownerKit = new ScriptedOwner({
        fake,
        owner,
        source: fileStepSource({ state, runId }),
        behave,
        ...(opts.silent ? { silent: opts.silent } : {}),
      }).start();
      try {
        const outcome = await executeRun({
          paths,
          spec,
          host,
          processToken: null,
          workflow,
          onEvent: (e) => events.push(e),
        });
        await ownerKit.stop();
        await ownerKit.untilSettled(5_000); // the close steps written as the run ended
        return { outcome, ownerKit, events };
      } finally {
        await ownerKit.stop();
      }
    },
    async close() {
      await host.close();
      await fake.stop();
      rmSync(root, { recursive: true, force: true });
    },
  };
}

export const answerSchema = {
  type: "object",
  properties: { summary: { type: "string" }, score: { type: "integer" } },
  required: ["summary", "score"],
  additionalProperties: false,
} as const;

export function json(value: unknown): {
  kind: "answer";
  messages: Array<{ text: string; phase: "final_answer" }>;
  usage: { input: number; output: number };
} {
  return {
    kind: "answer",
    messages: [{ text: JSON.stringify(value), phase: "final_answer" }],
    usage: { input: 100, output: 20 },
  };
}

export { defineWorkflow };
