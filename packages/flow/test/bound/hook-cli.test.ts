import { spawn } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bindingFile,
  bindOrchestrator,
  boundDir,
  closeOrchestrator,
  helperPairsFrom,
  ledgerFile,
  readLedger,
} from "../../src/bound/index.js";
import { runPaths } from "../../src/run/paths.js";
import { crwBin, ensureBuilt } from "../helpers/cli.js";

/** `crw flow hook pre-tool-use` as codex runs it: a real process of the built CLI, stdin JSON in. */
let state: string;
const owner = "019a0000-bbbb-7000-8000-000000000002";

function hook(
  input: unknown,
  args: string[] = [],
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [
      crwBin,
      "flow",
      "hook",
      "pre-tool-use",
      "--state",
      state,
      ...args,
    ]);
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.on("exit", (code) => resolve({ code: code ?? 1, stdout, stderr }));
    child.stdin.end(typeof input === "string" ? input : JSON.stringify(input));
  });
}

const spawnCall = (toolInput: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  session_id: owner,
  turn_id: "turn-1",
  transcript_path: join(state, "owner-rollout.jsonl"),
  cwd: state,
  hook_event_name: "PreToolUse",
  model: "mock-model",
  permission_mode: "bypassPermissions",
  tool_name: "spawn_agent",
  tool_input: toolInput,
  tool_use_id: "call_1",
  ...extra,
});

beforeAll(() => {
  ensureBuilt();
  state = mkdtempSync(join(tmpdir(), "crw-hook-"));
  writeFileSync(
    join(state, "owner-rollout.jsonl"),
    `${JSON.stringify({ type: "session_meta", payload: { id: owner, source: "vscode" } })}\n`,
  );
  writeFileSync(
    join(state, "child-rollout.jsonl"),
    `${JSON.stringify({
      type: "session_meta",
      payload: {
        session_id: owner,
        id: "child-1",
        parent_thread_id: owner,
        source: { subagent: { thread_spawn: { parent_thread_id: owner, depth: 1 } } },
        thread_source: "subagent",
        base_instructions: { text: "x".repeat(30_000) },
      },
    })}\n`,
  );
  const paths = runPaths(state, "run-1");
  mkdirSync(paths.dir, { recursive: true });
  writeFileSync(paths.runLock, JSON.stringify({ pid: process.pid }));
}, 120_000);

afterAll(() => rmSync(state, { recursive: true, force: true }));

describe("crw flow hook pre-tool-use (a real process)", () => {
  it("an owner bound to no run: the spawn is left as sent, nothing printed, no ledger", async () => {
    const r = await hook(
      spawnCall({ message: "CRW-ROLE: executor\n\nx", model: "a", reasoning_effort: "b" }),
    );
    expect(r).toMatchObject({ code: 0, stdout: "", stderr: "" });
    expect(readLedger(state, owner)).toEqual([]);
  });

  it("a bound owner's spawn is rewritten and its ledger line records role, op and warnings (S000-283)", async () => {
    const bound = bindOrchestrator({
      state,
      owner,
      runId: "run-1",
      policyDigest: "digest-1",
      helperPairs: helperPairsFrom({
        executor: { model: "m-exec", effort: "high" },
        reviewer: { model: "m-rev", effort: null },
      }),
    });
    expect(bound).toMatchObject({ bound: true });
    const message = "crw-flow-op: build/t1-a1\nCRW-ROLE: executor\n\nYour shell starts in …";
    const r = await hook(
      spawnCall({ message, agent_type: "worker", model: "cheap", reasoning_effort: "low" }),
    );
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({
      hookSpecificOutput: {
        hookEventName: "PreToolUse",
        permissionDecision: "allow",
        updatedInput: { message, agent_type: "worker", model: "m-exec", reasoning_effort: "high" },
      },
    });
    const noMarker = await hook(
      spawnCall({ message: "look around", agent_type: "explorer" }, { tool_use_id: "call_2" }),
    );
    expect(noMarker.stdout).toBe(""); // explorer is undecided: kept as sent
    expect(readLedger(state, owner)).toMatchObject([
      {
        owner,
        run_id: "run-1",
        policyDigest: "digest-1",
        tool_use_id: "call_1",
        turn_id: "turn-1",
        decision: "allow",
        role: "executor",
        role_from: "header",
        op: "build/t1-a1",
        agent_type: "worker",
        sent: { model: "cheap", effort: "low" },
        applied: { model: "m-exec", effort: "high" },
        warnings: ["role_agent_type_mismatch"],
      },
      {
        tool_use_id: "call_2",
        decision: "allow",
        role: "explorer",
        op: null,
        warnings: ["role_undecided", "unrecorded_spawn"],
      },
    ]);
  });

  it("a spawn by a subagent of the bound owner (its transcript is a subagent's) is refused (S000-275)", async () => {
    const r = await hook(
      spawnCall(
        { message: "crw-flow-op: x/t1-a1\nCRW-ROLE: explorer\n\nsub" },
        {
          transcript_path: join(state, "child-rollout.jsonl"),
          tool_use_id: "call_leaf",
        },
      ),
    );
    expect(JSON.parse(r.stdout).hookSpecificOutput).toMatchObject({
      permissionDecision: "deny",
      permissionDecisionReason: expect.stringMatching(/^leaf_spawn_refused/),
    });
    expect(readLedger(state, owner).at(-1)).toMatchObject({
      tool_use_id: "call_leaf",
      decision: "deny",
      reason: "leaf_spawn_refused",
    });
  });

  it("a full-history fork is refused through the CLI too (S000-276)", async () => {
    const r = await hook(spawnCall({ message: "CRW-ROLE: reviewer\n\nx", fork_context: true }));
    expect(JSON.parse(r.stdout).hookSpecificOutput).toMatchObject({
      permissionDecision: "deny",
      permissionDecisionReason: expect.stringMatching(/^full_history_fork_refused/),
    });
  });

  it("other tools pass untouched; bad stdin is a clear error that decides nothing", async () => {
    expect(
      await hook({ ...spawnCall({}), tool_name: "exec_command", tool_input: { cmd: "ls" } }),
    ).toMatchObject({
      code: 0,
      stdout: "",
    });
    const bad = await hook("{not json");
    expect(bad).toMatchObject({ code: 1, stdout: "" });
    expect(bad.stderr).toMatch(/not JSON; the tool call is left to the host/);
  });

  it("a ledger that cannot be written allows the spawn and says so on stderr (S000-287)", async () => {
    const ledger = ledgerFile(state, owner);
    const kept = readFileSync(ledger);
    rmSync(join(boundDir(state), "decisions"), { recursive: true });
    writeFileSync(join(boundDir(state), "decisions"), "a file where the ledger's directory should be");
    const r = await hook(spawnCall({ message: "crw-flow-op: r/t1-a1\nCRW-ROLE: reviewer\n\nx", model: "q" }));
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).hookSpecificOutput).toMatchObject({
      permissionDecision: "allow",
      updatedInput: { model: "m-rev" },
    });
    expect(r.stderr).toMatch(/ledger of .* cannot be written .* allowed all the same/);
    rmSync(join(boundDir(state), "decisions"));
    mkdirSync(join(boundDir(state), "decisions"), { mode: 0o700 });
    writeFileSync(ledger, kept);
  });

  it("an untrusted binding reads as none with a stderr warning; no spawn is refused for it (S000-288)", async () => {
    chmodSync(bindingFile(state, owner), 0o666);
    const r = await hook(spawnCall({ message: "CRW-ROLE: reviewer\n\nx", fork_context: true }));
    expect(r).toMatchObject({ code: 0, stdout: "" });
    expect(r.stderr).toMatch(/read as none: .* writable by group or others/);
    chmodSync(bindingFile(state, owner), 0o600);
  });

  it("a closed line unbinds the owner: its spawns are the host's again", async () => {
    expect(closeOrchestrator({ state, owner, runId: "run-1" })).toMatchObject({ closed: true });
    const r = await hook(
      spawnCall({ message: "crw-flow-op: a/t1-a1\nCRW-ROLE: executor\n\nx", model: "keep" }),
    );
    expect(r).toMatchObject({ code: 0, stdout: "" });
  });
});

describe("crw flow hook: bad input", () => {
  it("an unknown subcommand or option is an input error (exit 2); install into a missing CODEX_HOME exits 1", async () => {
    const run = (args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        const child = spawn(process.execPath, [crwBin, "flow", "hook", ...args]);
        let stdout = "";
        let stderr = "";
        child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
        child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
        child.on("exit", (code) => resolve({ code: code ?? 1, stdout, stderr }));
        child.stdin.end();
      });
    expect(await run(["nope"])).toMatchObject({ code: 2 });
    expect((await run(["pre-tool-use", "--bogus"])).code).toBe(2);
    const missing = await run(["install", "--codex-home", join(state, "no-such-home"), "--json"]);
    expect(missing.code).toBe(1);
    expect(JSON.parse(missing.stdout)).toMatchObject({
      error: { code: "unwritable", message: expect.stringMatching(/does not exist/) },
    });
  });
});
