import { createScriptedTurnRunner, type TurnHost, type TurnTool } from "@crw/brain";
import { RunnerExitedError, SubagentSessionDispatch } from "@crw/subagent";
import { describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { waitFor } from "./support/runners.js";
import { childTurn } from "./support/sessionTurns.js";

closePoolsAfterEach();

/**
 * A runner sends a turn's records one way (no answer), the last one in the turn's reply. What holds them to
 * the daemon's journal: each is written before anything the turn does after it, and before its outcome.
 */

/** The runner's agent loop on a named script: an Echo call, then the answer "finished". */
function echoDispatch() {
  const { pool } = makePool({
    agentOptions: () => ({
      scripts: { echo: [{ toolCalls: [{ name: "Echo", arguments: { say: "hi" } }] }, { text: "finished" }] },
    }),
  });
  return new SubagentSessionDispatch({ pool, inProcess: createScriptedTurnRunner() });
}

/** A daemon-side seam whose every call says when it starts and ends; `record` may be held or fail. */
function seam(record: (what: string) => Promise<void> = async () => {}) {
  const log: string[] = [];
  const host: TurnHost = {
    record: async (m) => {
      const what =
        m.role === "assistant"
          ? `assistant ${m.content.map((c) => (c.type === "text" ? c.text : `call ${c.name}`)).join("+")}`
          : `toolResult ${m.toolName}`;
      log.push(`record ${what} start`);
      await record(what);
      log.push(`record ${what} end`);
    },
    beforeToolCall: async (c) => {
      log.push(`intent ${c.name}`);
    },
    drainSteering: async () => {
      log.push("drain");
      return [];
    },
    progress: () => {},
  };
  const echo: TurnTool = {
    name: "Echo",
    description: "echo its argument",
    parameters: { type: "object", properties: { say: { type: "string" } } },
    execute: async (args) => {
      log.push("execute Echo");
      return { content: `echo:${String(args.say)}` };
    },
  };
  return { log, host, echo };
}

/** A latch a record waits on until the test lets it go. */
function gate() {
  let open: () => void = () => {};
  const opened = new Promise<void>((r) => {
    open = r;
  });
  return { opened, open };
}

describe("a runner turn's records, written by the daemon in order", () => {
  it("a slow record holds back the call after it: the intent waits for the assistant message, the drain for the tool's result", async () => {
    const slow = gate();
    const s = seam(async () => {
      await slow.opened;
    });
    const outcome = echoDispatch().runTurn(
      { ...childTurn(undefined, { task: "echo", tools: [s.echo] }), model: "scripted:echo" },
      s.host,
    );
    await waitFor(() => s.log.includes("record assistant call Echo start"));
    // The runner went on without an answer: time for its intent to reach the daemon, where it must wait.
    await new Promise((r) => setTimeout(r, 100));
    expect(s.log).toEqual(["record assistant call Echo start"]);
    slow.open();
    expect(await outcome).toEqual({ stopReason: "stop" });
    expect(s.log).toEqual([
      "record assistant call Echo start",
      "record assistant call Echo end",
      "intent Echo",
      "execute Echo",
      "record toolResult Echo start",
      "record toolResult Echo end",
      "drain",
      "record assistant finished start",
      "record assistant finished end",
    ]);
  });

  it("the turn's last record, carried by its reply, is written before the turn's outcome is reported", async () => {
    const last = gate();
    const s = seam(async (what) => {
      if (what === "assistant Done: summarize") await last.opened;
    });
    const { pool } = makePool();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: createScriptedTurnRunner() });
    const outcome = dispatch.runTurn(childTurn(undefined, { task: "summarize" }), s.host).then((o) => {
      s.log.push("outcome");
      return o;
    });
    await waitFor(() => s.log.includes("record assistant Done: summarize start"));
    // The reply has come (it carried the record): time for an outcome that did not wait to be reported.
    await new Promise((r) => setTimeout(r, 100));
    expect(s.log).toEqual(["record assistant Done: summarize start"]);
    last.open();
    expect(await outcome).toEqual({ stopReason: "stop" });
    expect(s.log).toEqual([
      "record assistant Done: summarize start",
      "record assistant Done: summarize end",
      "outcome",
    ]);
  });

  it("a record that fails refuses the turn's next call: the tool never runs, nothing after is recorded, the turn ends with its error", async () => {
    const s = seam(async (what) => {
      if (what === "assistant call Echo") throw new Error("the journal refused the row");
    });
    const outcome = await echoDispatch().runTurn(
      { ...childTurn(undefined, { task: "echo", tools: [s.echo] }), model: "scripted:echo" },
      s.host,
    );
    expect(outcome).toEqual({ stopReason: "error", errorMessage: "the journal refused the row" });
    expect(s.log).toEqual(["record assistant call Echo start"]);
  });

  it("the last record failing ends the turn with its error, not with the runner's stop", async () => {
    const s = seam(async () => {
      throw new Error("the run was fenced");
    });
    const { pool } = makePool();
    const dispatch = new SubagentSessionDispatch({ pool, inProcess: createScriptedTurnRunner() });
    const outcome = await dispatch.runTurn(childTurn(undefined, { task: "summarize" }), s.host);
    expect(outcome).toEqual({ stopReason: "error", errorMessage: "the run was fenced" });
    expect(s.log).toEqual(["record assistant Done: summarize start"]);
  });

  it("a call waiting behind a record when its runner dies is refused: the intent never runs after the turn's end", async () => {
    const slow = gate();
    const s = seam(async () => {
      await slow.opened;
    });
    const outcome = echoDispatch()
      .runTurn({ ...childTurn(undefined, { task: "echo", tools: [s.echo] }), model: "scripted:echo" }, s.host)
      .catch((e: unknown) => e);
    await waitFor(() => s.log.includes("record assistant call Echo start"));
    // time for the runner's intent to reach the daemon, where it waits behind the record
    await new Promise((r) => setTimeout(r, 100));
    const { killChildRunners } = await import("./support/kill.js");
    expect(await killChildRunners()).toBe(1);
    // the turn's end waits for the record it was sent; then the waiting intent finds the turn over
    await new Promise((r) => setTimeout(r, 100));
    slow.open();
    expect(await outcome).toBeInstanceOf(RunnerExitedError);
    await new Promise((r) => setTimeout(r, 50));
    expect(s.log).toEqual(["record assistant call Echo start", "record assistant call Echo end"]);
  });
});
