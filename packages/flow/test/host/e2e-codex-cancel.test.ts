import { existsSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type JournalRow, readJournalFile, runPaths } from "../../src/index.js";
import { crwFlow, waitFor } from "../helpers/cli.js";
import { type CodexScenario, runCodexScenario } from "./codexScenario.js";

/**
 * `crw flow cancel` while a subagent's turn runs on the real `codex app-server`: the architect's model
 * request never gets its answer, so its turn is still running when the user cancels the run from another
 * terminal. The owner (the mock model through Codex's shell) keeps asking `crw flow next` until the run
 * has ended.
 */

let run: CodexScenario;
let rows: Array<JournalRow & Record<string, unknown>>;
let cancel: { code: number; stdout: string; stderr: string };
let release: () => void = () => {};

beforeAll(async () => {
  const gate = new Promise<void>((ok) => {
    release = ok;
  });
  run = await runCodexScenario({
    subagent: async () => {
      await gate;
      return { items: [{ type: "message", text: "{}", phase: "final_answer" }] };
    },
    during: async ({ state, runId }) => {
      const id = await waitFor("the owner to start the run", () => runId(), 90_000);
      const journal = runPaths(state, id).journal;
      await waitFor(
        "the architect's turn bound",
        () =>
          existsSync(journal) &&
          readJournalFile(journal).rows.some((r) => r.type === "turn_started" && r.call === "architect.1"),
        90_000,
      );
      cancel = await crwFlow(["cancel", id, "--state", state, "--reason", "changed my mind", "--json"]);
    },
  });
  rows = readJournalFile(runPaths(run.state, run.owner.runId as string).journal).rows as typeof rows;
}, 200_000);

afterAll(async () => {
  release();
  await run?.stop();
});

describe("a run cancelled while a subagent's turn runs on the real codex", () => {
  it("the cancel ends the run cancelled, and the owner's next says it has ended", () => {
    expect(cancel.code, cancel.stderr).toBe(0);
    expect(JSON.parse(cancel.stdout)).toMatchObject({ state: "ended", status: "cancelled" });
    expect(rows.at(-1)).toMatchObject({ type: "run_ended", status: "cancelled", reason: "changed my mind" });
    expect(run.owner.failure).toBeNull();
    expect(run.owner.finalState).toMatchObject({ state: "ended" });
  });

  it("the architect's running turn was interrupted on the host (the row first) and reads interrupted there before the call is held", async () => {
    const turn = rows.find((r) => r.type === "turn_started" && r.call === "architect.1");
    const thread = rows.find((r) => r.type === "thread_started" && r.call === "architect.1");
    const intent = rows.find((r) => r.type === "interrupt_requested");
    const held = rows.find((r) => r.type === "held");
    expect(intent).toMatchObject({ call: "architect.1", reason: "cancelled", turn_id: turn?.turn_id });
    expect(held).toMatchObject({ call: "architect.1", reason: "cancelled" });
    expect(intent?.seq).toBeLessThan(held?.seq as number);
    const read = await run.codex.client.request<{
      thread: { turns: Array<{ id: string; status: string }> };
    }>("thread/read", { threadId: thread?.thread_id, includeTurns: true });
    expect(read.thread.turns.find((t) => t.id === turn?.turn_id)?.status).toBe("interrupted");
    // no later call was prepared
    expect(rows.filter((r) => r.type === "prepared").map((r) => r.call)).toEqual(["architect.1"]);
  });
});
