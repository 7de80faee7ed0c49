import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { TestProcesses } from "@crw/tools/processes";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bindOrchestrator,
  boundDir,
  helperPairsFrom,
  readBinding,
  readLedger,
} from "../../src/bound/index.js";
import { runPaths } from "../../src/run/paths.js";
import { crwBin, ensureBuilt } from "../helpers/cli.js";

let state: string;
const procs = new TestProcesses();
beforeAll(() => {
  ensureBuilt();
  state = mkdtempSync(join(tmpdir(), "crw-bound-crash-"));
}, 120_000);
afterAll(() => {
  procs.killAll();
  rmSync(state, { recursive: true, force: true });
});

describe("the flow-bound directory under crashes and concurrency (real processes)", () => {
  it("a holder SIGKILLed inside the lock leaves a lock let go: the next bind takes it over", async () => {
    const require = createRequire(import.meta.url);
    const jiti = join(dirname(require.resolve("jiti/package.json")), "lib", "jiti-cli.mjs");
    mkdirSync(boundDir(state), { recursive: true, mode: 0o700 });
    const child = spawn(
      process.execPath,
      [jiti, join(import.meta.dirname, "fixtures", "lock-holder.ts"), boundDir(state)],
      {
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    await new Promise<void>((resolve, reject) => {
      child.stdout?.on("data", (d: Buffer) => d.toString().includes("held") && resolve());
      child.on("exit", (code) => reject(new Error(`the holder exited ${code}`)));
    });
    expect(existsSync(join(boundDir(state), ".lock"))).toBe(true);
    const gone = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    await gone;
    expect(existsSync(join(boundDir(state), ".lock"))).toBe(true); // SIGKILL ran no cleanup
    const outcome = bindOrchestrator({
      state,
      owner: "owner-crash",
      runId: "r1",
      policyDigest: "d",
      helperPairs: helperPairsFrom({}),
      isLive: () => false,
    });
    expect(outcome).toMatchObject({ bound: true, wrote: true });
    expect(readBinding(state, "owner-crash").line?.run_id).toBe("r1");
    expect(existsSync(join(boundDir(state), ".lock"))).toBe(false);
  }, 60_000);

  it("a lock a killed machine left, its pid now another live process's, is let go at the next bind", async () => {
    mkdirSync(boundDir(state), { recursive: true, mode: 0o700 });
    const other = await procs.live();
    const started = TestProcesses.stat(other)?.startTime as number;
    writeFileSync(
      join(boundDir(state), ".lock"),
      JSON.stringify({ pid: other, nonce: "n", started: started - 100 }),
    );
    const outcome = bindOrchestrator({
      state,
      owner: "owner-reused-pid",
      runId: "r-reused",
      policyDigest: "d",
      helperPairs: helperPairsFrom({}),
      isLive: () => false,
    });
    expect(outcome).toMatchObject({ bound: true, wrote: true });
    expect(existsSync(join(boundDir(state), ".lock"))).toBe(false);
    expect(TestProcesses.stat(other)?.state).not.toBe("Z");
  });

  it("parallel spawns of one owner: every hook process appends its whole ledger line", async () => {
    const owner = "owner-parallel";
    const paths = runPaths(state, "r-par");
    mkdirSync(paths.dir, { recursive: true });
    writeFileSync(paths.runLock, JSON.stringify({ pid: process.pid }));
    bindOrchestrator({
      state,
      owner,
      runId: "r-par",
      policyDigest: "d",
      helperPairs: helperPairsFrom({ executor: { model: "m", effort: "high" } }),
    });
    const n = 8;
    const codes = await Promise.all(
      Array.from(
        { length: n },
        (_, i) =>
          new Promise<number>((resolve) => {
            const child = spawn(
              process.execPath,
              [crwBin, "flow", "hook", "pre-tool-use", "--state", state],
              {
                stdio: ["pipe", "ignore", "inherit"],
              },
            );
            child.on("exit", (code) => resolve(code ?? 1));
            child.stdin.end(
              JSON.stringify({
                session_id: owner,
                hook_event_name: "PreToolUse",
                tool_name: "spawn_agent",
                tool_use_id: `call_${i}`,
                tool_input: {
                  message: `crw-flow-op: n${i}/t1-a1\nCRW-ROLE: executor\n\n${"x".repeat(5000)}`,
                },
              }),
            );
          }),
      ),
    );
    expect(codes).toEqual(Array(n).fill(0));
    const ledger = readLedger(state, owner);
    expect(ledger.map((l) => l.tool_use_id).sort()).toEqual(
      Array.from({ length: n }, (_, i) => `call_${i}`).sort(),
    );
    expect(
      readFileSync(join(boundDir(state), "decisions", `${owner}.jsonl`), "utf8").split("\n"),
    ).toHaveLength(n + 1);
  }, 60_000);
});
