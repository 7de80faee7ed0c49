import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { checkRunId, checkSpec, FlowError, resolveTable } from "@crw/flow";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { crwFlow, ensureBuilt } from "./helpers/cli.js";

let root: string;
let env: NodeJS.ProcessEnv;
beforeAll(() => {
  ensureBuilt();
  root = mkdtempSync(join(tmpdir(), "crw-flow-bad-"));
  env = {
    ...process.env,
    CODEX_THREAD_ID: "owner-x",
    CRW_FLOW_HOST: "ws://127.0.0.1:9",
    CODEX_HOME: join(root, "h"),
  };
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("bad input gets a clear error and an exit code", () => {
  it("run ids with path characters are input errors", async () => {
    for (const bad of ["../etc", "a/b", ".hidden", "", "x".repeat(200)])
      expect(() => checkRunId(bad)).toThrow(FlowError);
    const r = await crwFlow(["next", "../../etc", "--state", join(root, "s"), "--json"], env);
    expect(r.code).toBe(2);
    expect(r.json()).toMatchObject({ error: { code: "run_id_invalid" } });
  });

  it("unknown commands and options, missing arguments are input errors (exit 2)", async () => {
    expect((await crwFlow(["frob"], env)).code).toBe(2);
    expect((await crwFlow(["next"], env)).code).toBe(2);
    expect((await crwFlow(["next", "r", "--bogus"], env)).code).toBe(2);
    const d = await crwFlow(
      ["dispatched", "r", "c.1", "--k", "1", "--attempt", "1", "--state", join(root, "s")],
      env,
    );
    expect(d.code).toBe(2);
    expect(d.stderr).toContain("--agent");
    expect(
      (await crwFlow(["dispatched", "r", "c.1", "--agent", "a", "--k", "x", "--attempt", "1"], env)).code,
    ).toBe(2);
  });

  it("a workflow module that throws, or exports no workflow, is refused before anything is written", async () => {
    const throws = join(root, "throws.mjs");
    writeFileSync(throws, 'throw new Error("broken at import");');
    const none = join(root, "none.mjs");
    writeFileSync(none, "export default 42;");
    for (const wf of [throws, none]) {
      const state = join(root, "state-wf");
      const r = await crwFlow(["start", wf, "--state", state, "--run", "r-wf", "--json"], env, root);
      expect(r.code).toBe(2);
      expect(r.json()).toMatchObject({ error: { code: "workflow_invalid" } });
    }
    const input = await crwFlow(
      ["start", none, "--input", "{not json", "--state", join(root, "s2")],
      env,
      root,
    );
    expect(input.code).toBe(2);
    const noOwner = { ...env };
    delete noOwner.CODEX_THREAD_ID;
    const ok = join(root, "ok.mjs");
    writeFileSync(ok, 'export default { name: "ok", run: async () => 1 };');
    // a session start needs an owner (with no --backend and no owner the start is a local run)
    const o = await crwFlow(
      ["start", ok, "--backend", "session", "--state", join(root, "s3")],
      noOwner,
      root,
    );
    expect(o.code).toBe(2);
    expect(o.stderr).toContain("--owner");
  });

  it("a malformed or hostile step file is reported by next and never handed out", async () => {
    const { runPaths, writeSpec, SPEC_FORMAT } = await import("@crw/flow");
    const state = join(root, "state-steps");
    const paths = runPaths(state, "r-steps");
    mkdirSync(join(paths.steps, "c.1"), { recursive: true });
    writeSpec(paths.spec, {
      format: SPEC_FORMAT,
      run_id: "r-steps",
      workflow: join(root, "ok.mjs"),
      workflow_name: "ok",
      input: null,
      backend: "session",
      owner: "o",
      pool: 1,
      repo: root,
      host: "ws://127.0.0.1:9",
      created_at: "t",
    });
    writeFileSync(join(paths.steps, "c.1", "t1-a1.json"), '{"run_id":"r-steps","action":"rm -rf /"}');
    writeFileSync(
      join(paths.journal),
      `${JSON.stringify({ format: "crw-flow-journal", version: 1, run_id: "r-steps", created_at: "t" })}\n${JSON.stringify({ seq: 0, at: "t", type: "run_paused", reason: "x" })}\n`,
    );
    const r = await crwFlow(["next", "r-steps", "--state", state, "--json"], env);
    expect(r.code).toBe(0);
    const a = r.json();
    expect(a.steps).toEqual([]);
    expect(a.warnings).toEqual([expect.stringContaining("cannot be read")]);
  });

  it("property: run.json and the role store are checked whole: any other shape is an input error, never a crash", () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 3 }), (v) => {
        for (const check of [() => checkSpec(v), () => resolveTable(v, "store")]) {
          try {
            check();
          } catch (e) {
            expect(e).toBeInstanceOf(FlowError);
            expect((e as FlowError).exitCode).toBe(2);
          }
        }
      }),
    );
  });
});

describe("a run process that cannot start", () => {
  it("start says so (exit 1) and names the log when the process ends before it holds the run", async () => {
    const wf = join(root, "ok2.mjs");
    writeFileSync(wf, 'export default { name: "ok2", run: async () => 1 };');
    const dies = join(root, "dies.mjs");
    writeFileSync(dies, "process.exit(3);");
    const r = await crwFlow(
      ["start", wf, "--state", join(root, "s-dead"), "--run", "dead", "--json"],
      { ...env, CRW_CLI_ENTRY: dies },
      root,
    );
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("process.log");
    expect(r.stderr).toContain("crw flow resume dead");
  });
});
