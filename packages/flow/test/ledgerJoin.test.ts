import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  appendLedger,
  executeRun,
  type LedgerLine,
  readJournalFile,
  runPaths,
  type StepFile,
  writeSpec,
} from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import { answerSchema, defineWorkflow, type InProcessRun, inProcessRun, until } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

/** The owner spawns the step's subagent; its spawn item on the owner shows no prompt. */
function spawnUnseen(r: InProcessRun, step: StepFile) {
  const agent = r.spawn(step, "explorer");
  const item = r.fake.state
    .get(r.owner)
    .turns.flatMap((t) => t.items)
    .find((i) => i.type === "collabAgentToolCall" && i.receiverThreadIds.includes(agent.threadId));
  if (item?.type !== "collabAgentToolCall") throw new Error("no spawn item");
  (item as { prompt: string | null }).prompt = null;
  return { agent, item };
}

/** The spawn hook's ledger line for the owner's tool call `toolUseId`, naming `op`. */
function ledgerLineOf(r: InProcessRun, toolUseId: string, op: string): LedgerLine {
  return {
    v: 1,
    at: new Date().toISOString(),
    owner: r.owner,
    run_id: r.spec.run_id,
    policyDigest: "d",
    tool_use_id: toolUseId,
    turn_id: null,
    decision: "allow",
    reason: null,
    role: "explorer",
    role_from: "crw-role",
    op,
    agent_type: "explorer",
    sent: { model: null, effort: null },
    applied: { model: null, effort: null },
    warnings: [],
  };
}

const one = () =>
  defineWorkflow({
    name: "join",
    run: (ctx) => ctx.call({ role: "explorer", task: "one", schema: answerSchema }),
  });

describe("the ledger join", () => {
  it("the run joins the hook ledger's op with the owner's collabAgentToolCall spawn items to find a published step's subagent", async () => {
    run = await inProcessRun({});
    const r = run;
    const { done } = r.background(one());
    const [step] = await r.steps(1);
    if (!step) throw new Error("no step");
    // the owner's spawn item shows no prompt (nothing carries the marker there), and the owner reports
    // nothing: only the hook's ledger line of the op ties the tool call to the step
    const { agent, item } = spawnUnseen(r, step);
    appendLedger(r.paths.state, ledgerLineOf(r, item.id, step.marker));
    r.fake.answer(agent.threadId, '{"summary":"s","score":1}');
    expect(await done).toMatchObject({ state: "completed" });
    expect(r.rows().find((x) => x.type === "thread_started")).toMatchObject({ thread_id: agent.threadId });
  });

  it("after a restart the new process joins the ledger's op with the owner's spawn items to find the subagent of the step the dead one published (S000-289)", async () => {
    run = await inProcessRun({});
    const r = run;
    // the first process publishes the step; the owner spawns for it, unseen and unreported
    const first = r.background(one());
    first.done.catch(() => {}); // it never binds (its state has no ledger) and is dropped with the host
    const [step] = await r.steps(1);
    if (!step) throw new Error("no step");
    const { agent, item } = spawnUnseen(r, step);
    // the restart: the run's journal as the first process left it (its step published), in a state
    // directory whose spawn hook ledger has the spawn's line, and a new process on it
    const rows = readFileSync(r.paths.journal, "utf8");
    const stateB = join(r.root, "state-b");
    const pathsB = runPaths(stateB, r.spec.run_id);
    mkdirSync(pathsB.dir, { recursive: true });
    writeSpec(pathsB.spec, r.spec);
    writeFileSync(pathsB.journal, rows);
    appendLedger(stateB, ledgerLineOf(r, item.id, step.marker));
    const second = executeRun({
      paths: pathsB,
      spec: r.spec,
      host: r.host,
      processToken: null,
      workflow: one(),
    });
    await until("the new process's bind", () =>
      readJournalFile(pathsB.journal).rows.some((x) => x.type === "thread_started"),
    );
    r.fake.answer(agent.threadId, '{"summary":"s","score":1}');
    expect(await second).toMatchObject({ state: "completed" });
    const after = readJournalFile(pathsB.journal).rows;
    expect(after.find((x) => x.type === "thread_started")).toMatchObject({ thread_id: agent.threadId });
    // the dead process's step was the one bound: no step published again
    expect(after.filter((x) => x.type === "step_published")).toHaveLength(1);
  });
});
