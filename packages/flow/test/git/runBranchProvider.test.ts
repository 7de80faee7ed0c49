import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type ModelProtocol, type ModelRequest, startModelServer } from "@crw/tools/models";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJournalFile } from "../../src/journal/journal.js";
import type { JournalRow, RowOf } from "../../src/journal/rows.js";
import { crwFlow, ensureBuilt, waitFor } from "../helpers/cli.js";
import { tempRepo } from "./repo.js";

/**
 * The run's branch as a user meets it: the local backend against a model server of our own on 127.0.0.1
 * speaking a real provider protocol, the agent loop's real write and read tools. Two parallel executors
 * write a file each; the reviewer after them reads both from its checkout and says what it read; the run
 * lands on main.
 */
const answer = {
  type: "object",
  required: ["ok"],
  properties: { ok: { type: "boolean" }, saw: { type: "string" } },
};
const workflow = `
const answer = ${JSON.stringify(answer)};
export default {
  name: "provider-branch",
  async run(ctx) {
    const parallel = await Promise.all(
      ["left", "right"].map((name) =>
        ctx.callWithWork({ role: "executor", node: name, task: "WRITE " + name + ".txt", schema: answer }),
      ),
    );
    const review = await ctx.callWithWork({ role: "reviewer", node: "review", task: "READ left.txt right.txt", schema: answer });
    return { parallel: parallel.map((p) => p.work), review: review.answer, reviewStart: review.work.start };
  },
};
`;

/** Plays the model: an executor writes its file, the reviewer reads both, then each answers its JSON. */
function play(request: ModelRequest) {
  const task = request.userTexts.join("\n");
  const done = request.toolResults.length;
  const write = /WRITE (\w+\.txt)/.exec(task);
  if (write) {
    if (done === 0)
      return { tool: { name: "write", arguments: { path: write[1], content: `${write[1]} body\n` } } };
    return { text: '{"ok":true}' };
  }
  const reads = ["left.txt", "right.txt"];
  if (done < reads.length) return { tool: { name: "read", arguments: { path: reads[done] as string } } };
  const saw = request.toolResults.map((r) => r.text.trim()).join(" | ");
  return { text: JSON.stringify({ ok: !request.toolResults.some((r) => r.isError), saw }) };
}

let server: Awaited<ReturnType<typeof startModelServer>>;
beforeAll(async () => {
  ensureBuilt();
  server = await startModelServer(play);
}, 180_000);
afterAll(() => server?.close());

const protocols: ModelProtocol[] = ["openai-completions", "openai-responses", "anthropic-messages"];

describe("the run's branch with a real provider protocol", () => {
  it.each(protocols)(
    "%s: parallel executors' files reach the reviewer's checkout through their merge, and land on main",
    async (protocol) => {
      const { root, repo, start: base, sh } = tempRepo("crw-flow-provider-branch-");
      const state = join(root, "state");
      const wf = join(root, "wf.mjs");
      writeFileSync(wf, workflow);
      const env: NodeJS.ProcessEnv = { ...process.env, BRANCH_TEST_KEY: "k-branch" };
      delete env.CODEX_THREAD_ID;
      delete env.CRW_FLOW_FAULT;
      const baseUrl = protocol === "anthropic-messages" ? server.anthropicBaseUrl : server.openaiBaseUrl;
      const run = protocol;
      const start = await crwFlow(
        [
          "start",
          wf,
          "--backend",
          "local",
          "--repo",
          repo,
          "--state",
          state,
          "--run",
          run,
          "--model",
          `${protocol}:mock`,
          "--model-base-url",
          baseUrl,
          "--model-api-key-env",
          "BRANCH_TEST_KEY",
          "--json",
        ],
        env,
      );
      expect(start.code, start.stderr).toBe(0);
      const journal = join(state, "flow", run, "journal.jsonl");
      const rows = (): JournalRow[] => (existsSync(journal) ? readJournalFile(journal).rows : []);
      const ended = await waitFor(`${run} to end`, () => rows().find((r) => r.type === "run_ended"), 60_000);
      expect(ended).toMatchObject({ status: "completed" });
      const result = (ended as RowOf<"run_ended">).result as {
        parallel: Array<{ start: string; commit: string; paths: string[] }>;
        review: { ok: boolean; saw: string };
        reviewStart: string;
      };
      expect(result.parallel.map((w) => w.paths)).toEqual([["left.txt"], ["right.txt"]]);
      for (const w of result.parallel) expect(w.start).toBe(base);
      // the reviewer's real read tool found both files in its checkout: it started from their merge
      expect(result.review).toEqual({ ok: true, saw: "left.txt body | right.txt body" });
      const merge = rows().find((r): r is RowOf<"branch_merged"> => r.type === "branch_merged");
      expect(result.reviewStart).toBe(merge?.commit);
      expect(
        sh(repo, "rev-list", "--parents", "-1", String(merge?.commit)).split(" ").slice(1).sort(),
      ).toEqual(result.parallel.map((w) => w.commit).sort());
      // the requests went to our server, with the key from the named variable
      const mine = server.requests.filter((r) => r.protocol === protocol);
      expect(mine.length).toBeGreaterThanOrEqual(7);
      const key =
        protocol === "anthropic-messages" ? mine[0]?.headers["x-api-key"] : mine[0]?.headers.authorization;
      expect(key).toContain("k-branch");
      const land = await crwFlow(["land", run, "--state", state, "--json"]);
      expect(land.code, land.stderr).toBe(0);
      expect(land.json()).toMatchObject({
        into: "main",
        fast_forward: true,
        changed_paths: ["left.txt", "right.txt"],
      });
      expect(sh(repo, "show", "main:left.txt")).toBe("left.txt body");
      expect(sh(repo, "show", "main:right.txt")).toBe("right.txt body");
      expect(sh(repo, "status", "--porcelain")).toBe("");
    },
    120_000,
  );
});
