import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FakeAppServer } from "@crw/tools/codex";
import { afterEach, describe, expect, it } from "vitest";
import { noteHostNotification } from "../../src/backends/appServerTokens.js";
import { createAppServerHost, defineWorkflow, executeRun, type Workflow } from "../../src/index.js";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow } from "../../src/journal/rows.js";
import { writeCancelRequest } from "../../src/run/cancelRequest.js";
import { type RunPaths, runPaths } from "../../src/run/paths.js";
import { type RunSpec, SPEC_FORMAT, writeSpec } from "../../src/run/spec.js";

/**
 * The app-server backend when the run pauses: every other call's running turn is interrupted (the row
 * first) and the call held, and the token ceiling pauses the run as on the session backend. Against the
 * fake app-server over ws; the engine runs the turns itself.
 */
const cleanups: Array<() => Promise<void>> = [];
let runs = 0;
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

const schema = { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } };
type Row = JournalRow & Record<string, unknown>;

async function appServerRun(
  workflow: Workflow,
  onTurn: (fake: FakeAppServer, threadId: string, marker: string, paths: RunPaths) => void,
  extra: Partial<RunSpec> = {},
) {
  const root = mkdtempSync(join(tmpdir(), "crw-flow-as-pause-"));
  const fake = await FakeAppServer.start();
  const host = createAppServerHost({
    transport: fake.url,
    onEvent: (e) => {
      if (e.type === "notification") noteHostNotification(e.notification);
    },
  });
  cleanups.push(async () => {
    await host.close();
    await fake.stop();
    rmSync(root, { recursive: true, force: true });
  });
  fake.onTurnStart((threadId, _turn, text) => {
    const marker = /^crw-flow-op: (\S+)/m.exec(text)?.[1] ?? "";
    setTimeout(() => onTurn(fake, threadId, marker, paths), 20);
  });
  const paths = runPaths(join(root, "state"), `p${++runs}`);
  mkdirSync(paths.dir, { recursive: true });
  const repo = join(root, "repo");
  mkdirSync(repo);
  const spec: RunSpec = {
    format: SPEC_FORMAT,
    run_id: paths.runId,
    workflow: join(root, "inline.mjs"),
    workflow_name: workflow.name,
    input: null,
    backend: "app-server",
    owner: null,
    pool: 4,
    repo,
    host: fake.url,
    created_at: new Date().toISOString(),
    env: { TMPDIR: tmpdir() },
    poll_ms: 20,
    lost_after_ms: 2_000,
    ...extra,
  };
  writeSpec(paths.spec, spec);
  const outcome = await executeRun({ paths, spec, host, processToken: null, workflow });
  return { outcome, rows: readJournalFile(paths.journal).rows as Row[], fake };
}

describe("app-server backend: a pause stops every call", () => {
  it("a held call pauses the run: the other call's running turn is interrupted (interrupt_requested first) and the call held", async () => {
    const wf = defineWorkflow({
      name: "pair",
      run: (ctx) =>
        Promise.all([
          ctx.call({ role: "architect", task: "fails", schema }),
          ctx.call({ role: "explorer", task: "runs on", schema }),
        ]),
    });
    let explorerThread = "";
    const { outcome, rows, fake } = await appServerRun(wf, (f, threadId, marker) => {
      if (marker.startsWith("architect.1/"))
        setTimeout(() => f.failTurn(threadId, "internalServerError", { message: "boom" }), 100);
      else explorerThread = threadId; // never answers: still running when the run pauses
    });
    expect(outcome).toEqual({ state: "paused", reason: "held:architect.1" });
    const held = rows.filter((r) => r.type === "held");
    expect(held.map((h) => [h.call, h.reason])).toEqual([
      ["architect.1", "host_failure"],
      ["explorer.1", "held:architect.1"],
    ]);
    const intent = rows.find((r) => r.type === "interrupt_requested");
    const turn = rows.find((r) => r.type === "turn_started" && r.call === "explorer.1");
    expect(intent).toMatchObject({
      call: "explorer.1",
      reason: "held:architect.1",
      k: 1,
      attempt: 1,
      turn_id: turn?.turn_id,
    });
    expect(intent?.seq).toBeLessThan(held[1]?.seq as number);
    // the interrupt reached the host, for that turn
    expect(fake.requests.filter((q) => q.method === "turn/interrupt").map((q) => q.params)).toContainEqual(
      expect.objectContaining({ threadId: explorerThread, turnId: turn?.turn_id }),
    );
    const read = await createAppServerHost({ transport: fake.url }).readThread(explorerThread);
    expect(read.ok && read.value.turns[0]?.status).toBe("interrupted");
  });

  it("the token ceiling pauses an app-server run before a new call starts; a call in flight is interrupted and held", async () => {
    const wf = defineWorkflow({
      name: "ceiling",
      run: async (ctx) => {
        await ctx.call({ role: "architect", task: "first", schema });
        const slow = ctx.call({ role: "explorer", task: "slow", schema });
        await ctx.call({ role: "reviewer", task: "second", schema });
        await ctx.call({ role: "critic", task: "third", schema });
        return slow;
      },
    });
    const { outcome, rows } = await appServerRun(
      wf,
      (f, threadId, marker) => {
        if (marker.startsWith("explorer.1/")) return; // runs until the pause
        f.answer(threadId, '{"ok":true}', { input: 500, output: 100 });
      },
      { token_ceiling: 1000 },
    );
    expect(outcome).toEqual({ state: "paused", reason: "token_ceiling" });
    expect(rows.filter((r) => r.type === "prepared").map((r) => r.call)).toEqual([
      "architect.1",
      "explorer.1",
      "reviewer.1",
    ]);
    expect(rows.filter((r) => r.type === "completed").map((r) => r.call)).toEqual([
      "architect.1",
      "reviewer.1",
    ]);
    expect(rows.filter((r) => r.type === "run_paused")).toMatchObject([{ reason: "token_ceiling" }]);
    expect(rows.find((r) => r.type === "interrupt_requested")).toMatchObject({
      call: "explorer.1",
      reason: "token_ceiling",
    });
    expect(rows.find((r) => r.type === "held")).toMatchObject({
      call: "explorer.1",
      reason: "token_ceiling",
    });
  });
});

describe("app-server backend: a call's deadline", () => {
  it("a turn still running at the call's deadline is interrupted (the row first), the call held for it and the run paused", async () => {
    const wf = defineWorkflow({
      name: "deadline",
      run: (ctx) => ctx.call({ role: "explorer", task: "slow", schema, deadlineMs: 600 }),
    });
    let thread = "";
    const { outcome, rows, fake } = await appServerRun(wf, (_f, threadId) => {
      thread = threadId; // never answers
    });
    expect(outcome).toEqual({ state: "paused", reason: "held:explorer.1" });
    const started = rows.find((r) => r.type === "thread_started");
    const intent = rows.find((r) => r.type === "interrupt_requested");
    const held = rows.find((r) => r.type === "held");
    expect(intent).toMatchObject({ call: "explorer.1", reason: "deadline" });
    expect(Date.parse(intent?.at as string) - Date.parse(started?.at as string)).toBeGreaterThanOrEqual(600);
    expect(held).toMatchObject({ call: "explorer.1", reason: "deadline" });
    expect(intent?.seq).toBeLessThan(held?.seq as number);
    expect(rows.find((r) => r.type === "run_paused")).toMatchObject({ reason: "held:explorer.1" });
    const read = await createAppServerHost({ transport: fake.url }).readThread(thread);
    expect(read.ok && read.value.turns[0]?.status).toBe("interrupted");
  });
});

describe("app-server backend: a cancelled run", () => {
  it("the turn still running is interrupted (the row first), the call held and the run ended cancelled", async () => {
    const wf = defineWorkflow({
      name: "cancel",
      run: (ctx) => ctx.call({ role: "explorer", task: "slow", schema }),
    });
    let thread = "";
    const { outcome, rows, fake } = await appServerRun(wf, (_f, threadId, _marker, paths) => {
      thread = threadId; // never answers: the user cancels the run meanwhile
      writeCancelRequest(paths, "not needed");
    });
    expect(outcome).toEqual({ state: "cancelled", reason: "not needed" });
    const intent = rows.find((r) => r.type === "interrupt_requested");
    const held = rows.find((r) => r.type === "held");
    expect(intent).toMatchObject({ call: "explorer.1", reason: "cancelled" });
    expect(held).toMatchObject({ call: "explorer.1", reason: "cancelled" });
    expect(intent?.seq).toBeLessThan(held?.seq as number);
    expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "cancelled", reason: "not needed" });
    const read = await createAppServerHost({ transport: fake.url }).readThread(thread);
    expect(read.ok && read.value.turns[0]?.status).toBe("interrupted");
  });
});
