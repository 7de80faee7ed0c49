import { existsSync, mkdtempSync, rmSync, watch, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { lockHolder, readJournalFile, runPaths } from "@crw/flow";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempRepo } from "./git/repo.js";
import { crwFlow, ensureBuilt, plainEnv, waitFor } from "./helpers/cli.js";

/**
 * A local run in a git checkout: it waits for a decision, then its executor writes a file that crw commits
 * onto the run's branch. Committing reads the executor's pending tree through a private index in a
 * temporary directory. The run is started below one TMPDIR and answered (so relaunched) from a shell whose
 * TMPDIR does not exist.
 */
const workflowSource = `
export default {
  name: "tmp-ops",
  async run(ctx) {
    await ctx.decide({ id: "go", question: "Write it?" });
    return ctx.callWithWork({ role: "executor", node: "write", task: "write NOTES.md", schema: { type: "object" } });
  },
};
`;
const script = {
  calls: {
    write: [
      { toolCalls: [{ name: "write", arguments: { path: "NOTES.md", content: "notes\n" } }] },
      { text: "{}" },
    ],
  },
};

let root: string;
beforeAll(() => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-tmpops-"));
}, 180_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("a run's own temporary files", () => {
  it("the temporary files of the run's operations (the commit's private index) land below the recorded TMPDIR, also after a relaunch from a shell with another", async () => {
    const recorded = mkdtempSync(join(root, "recorded-"));
    const missing = join(root, "no-such-tmp");
    const { repo } = tempRepo("crw-flow-tmpops-repo-");
    const workflow = join(root, "tmp-ops.mjs");
    writeFileSync(workflow, workflowSource);
    const scriptPath = join(root, "script.json");
    writeFileSync(scriptPath, JSON.stringify(script));
    const state = join(root, "state");
    const paths = runPaths(state, "tmp-ops");
    const env: NodeJS.ProcessEnv = plainEnv();
    const seen: string[] = [];
    const watcher = watch(recorded, (_event, name) => {
      if (name) seen.push(String(name));
    });
    try {
      const start = await crwFlow(
        [
          "start",
          workflow,
          "--backend",
          "local",
          "--model",
          "scripted",
          "--script",
          scriptPath,
          "--repo",
          repo,
          "--run",
          "tmp-ops",
          "--state",
          state,
          "--json",
        ],
        { ...env, TMPDIR: recorded },
        root,
      );
      expect(start.code, start.stderr).toBe(0);
      await waitFor(
        "the run to wait for its decision and let the run go",
        () =>
          existsSync(paths.journal) &&
          readJournalFile(paths.journal).rows.some((x) => x.type === "run_paused") &&
          lockHolder(paths.runLock) === null,
        30_000,
      );
      expect(seen.filter((n) => n.startsWith("crw-index-"))).toEqual([]);
      const answer = await crwFlow(["answer", "tmp-ops", "go", "yes", "--state", state, "--json"], {
        ...env,
        TMPDIR: missing,
      });
      expect(answer.code, answer.stderr).toBe(0);
      const ended = await waitFor(
        "the run to end",
        () => readJournalFile(paths.journal).rows.find((x) => x.type === "run_ended"),
        30_000,
      );
      expect(ended).toMatchObject({ status: "completed" });
      const done = readJournalFile(paths.journal).rows.find((x) => x.type === "completed");
      // the executor's change was committed: its pending tree was read through the private index
      expect(done).toMatchObject({ work: { paths: ["NOTES.md"], commit: expect.any(String) } });
      await waitFor("the watch to report", () => seen.some((n) => n.startsWith("crw-index-")), 5_000);
      expect(existsSync(missing)).toBe(false);
    } finally {
      watcher.close();
      rmSync(repo, { recursive: true, force: true });
    }
  }, 90_000);
});
