import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { alive } from "@crw/tools/processes";
import { scratchDir } from "@crw/tools/scratch";
import { beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";

/**
 * A workflow that leaves one call's promise unawaited while it awaits another: when the run stops (the
 * unawaited call's provider fails, the call is held and the run pauses), the rejection of the unawaited
 * call is part of the stop. The run process ends with its rows and its "run process ends" line, lets its
 * locks go, and never dies of an unhandled rejection.
 */
const workflow = `
const schema = { type: "object", required: ["n"], properties: { n: { type: "integer" } } };
export default {
  name: "unawaited",
  async run(ctx) {
    const first = ctx.call({ role: "explorer", node: "fails", task: "this one fails", schema });
    const second = await ctx.call({ role: "explorer", node: "waits", task: "this one waits", schema });
    return { second, first: await first };
  },
};
`;

const script = {
  calls: {
    "fails.1": [{ stopReason: "error", errorMessage: "provider down" }],
    "waits.1": [{ text: '{"n":1}' }],
  },
};

function plainEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.CODEX_THREAD_ID;
  delete env.CRW_FLOW_FAULT;
  return env;
}

beforeAll(() => ensureBuilt(), 180_000);

describe("a call's promise left unawaited when the run stops", () => {
  it("the run process pauses with its rows, logs its end and lets its locks go: no unhandled rejection", async () => {
    const root = scratchDir("crw-flow-unawaited-");
    const wf = join(root, "unawaited.mjs");
    const scriptFile = join(root, "script.json");
    writeFileSync(wf, workflow);
    writeFileSync(scriptFile, JSON.stringify(script));
    const state = join(root, "state");
    const start = await crwFlow(
      ["start", wf, "--backend", "local", "--script", scriptFile, "--pool", "1", "--state", state],
      plainEnv(),
    );
    expect(start.code, start.stderr).toBe(0);
    const run = readdirSync(join(state, "flow"))[0] as string;
    const dir = join(state, "flow", run);
    const pid = Number(/\(pid (\d+)\)/.exec(start.stdout)?.[1]);
    expect(pid).toBeGreaterThan(0);
    await waitFor("the run process to end", () => !alive(pid), 30_000);
    const rows = readJournalFile(join(dir, "journal.jsonl")).rows;
    expect(rows.filter((r) => r.type === "held")).toMatchObject([
      { call: "fails.1", reason: "provider_failure" },
    ]);
    expect(rows.filter((r) => r.type === "run_paused")).toMatchObject([{ reason: "held:fails.1" }]);
    expect(rows.some((r) => r.type === "run_ended")).toBe(false);
    const log = readFileSync(join(dir, "process.log"), "utf8");
    expect(log).not.toMatch(/unhandled|UnhandledPromiseRejection/i);
    expect(log).toMatch(/"msg":"run process ends","state":"paused"/);
    // the process let its locks go (a crash leaves its process lock file behind)
    expect(readdirSync(dir).filter((f) => f.startsWith("process.") && f.endsWith(".lock"))).toEqual([]);
    expect(existsSync(join(dir, "run.lock"))).toBe(false);
  });
});
