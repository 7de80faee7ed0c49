import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  appendLedger,
  bindOrchestrator,
  boundDir,
  decideSpawn,
  helperPairsFrom,
  ledgerLine,
  validateLine,
} from "../../src/bound/index.js";
import {
  checkoutDigest,
  ensureWorktree,
  outsideDigest,
  sharedDigest,
  type TraceDigests,
  takeTraceDigests,
  traceWarnings,
} from "../../src/git/index.js";
import { tempRepo } from "./repo.js";

let t: ReturnType<typeof tempRepo>;
let P: string;
let state: string;
const runId = "run-1";
beforeEach(async () => {
  t = tempRepo();
  P = join(t.root, "workspaces", "call-1");
  await ensureWorktree({ repo: t.repo, path: P, commit: t.start });
  state = join(t.root, "state");
  mkdirSync(state);
});
afterEach(() => rmSync(t.root, { recursive: true, force: true }));

const digests = () =>
  takeTraceDigests({ workspace: P, ownerCwd: t.repo, repo: t.repo, runId, boundDir: boundDir(state) });

describe("trace digests", () => {
  it("the workspace digest is P's status and HEAD: an edit, a new file, a commit and a second edit of a dirty file all change it (S000-302)", async () => {
    const d0 = await checkoutDigest(P);
    expect(await checkoutDigest(P)).toBe(d0);
    writeFileSync(join(P, "a.txt"), "edited\n");
    const d1 = await checkoutDigest(P);
    expect(d1).not.toBe(d0);
    writeFileSync(join(P, "a.txt"), "edited again\n");
    const d2 = await checkoutDigest(P);
    expect(d2).not.toBe(d1);
    writeFileSync(join(P, "new.txt"), "n\n");
    const d3 = await checkoutDigest(P);
    expect(d3).not.toBe(d2);
    t.sh(P, "add", "-A");
    t.sh(P, "commit", "-q", "-m", "moved");
    const d4 = await checkoutDigest(P);
    expect(d4).not.toBe(d3);
    // HEAD alone: a commit that leaves the status as it was (clean) still changes the digest
    t.sh(P, "commit", "-q", "--allow-empty", "-m", "HEAD only");
    expect(t.sh(P, "status", "--porcelain")).toBe("");
    expect(await checkoutDigest(P)).not.toBe(d4);
  }, 30_000);

  it("the outside digest is the owner's checkout's only when it is a git checkout other than P (S000-303)", async () => {
    expect(await outsideDigest(t.repo, P)).toBe(await checkoutDigest(t.repo));
    expect(await outsideDigest(P, P)).toBeNull(); // the owner works in P itself
    expect(await outsideDigest(join(P, "."), P)).toBeNull();
    expect(await outsideDigest(state, P)).toBeNull(); // not a git checkout
    expect(await outsideDigest(null, P)).toBeNull();
  }, 30_000);

  it("the shared digest covers refs/crw/ but the run's own refs, and the flow-bound binding files (S000-304)", async () => {
    const base = () => sharedDigest({ repo: t.repo, runId, boundDir: boundDir(state) });
    const d0 = await base();
    t.sh(t.repo, "update-ref", `refs/crw/flow/${runId}/stray/n/a1-c`, t.start);
    expect(await base()).toBe(d0); // the run's own refs: the run moves them itself
    t.sh(t.repo, "update-ref", "refs/crw/flow/other-run/stray/n/a1-c", t.start);
    const d1a = await base();
    expect(d1a).not.toBe(d0);
    // any ref under refs/crw/, not only flow's; a ref elsewhere is no shared state
    t.sh(t.repo, "update-ref", "refs/crw/land/main", t.start);
    const d1 = await base();
    expect(d1).not.toBe(d1a);
    t.sh(t.repo, "update-ref", "refs/heads/side", t.start);
    expect(await base()).toBe(d1);
    bindOrchestrator({
      state,
      owner: "owner-1",
      runId,
      policyDigest: "d",
      helperPairs: helperPairsFrom({}),
      isLive: () => false,
    });
    expect(await base()).not.toBe(d1);
  }, 30_000);

  it("the shared digest leaves out the hook's ledger and claims (S000-305)", async () => {
    bindOrchestrator({
      state,
      owner: "owner-1",
      runId,
      policyDigest: "d",
      helperPairs: helperPairsFrom({}),
      isLive: () => false,
    });
    const d0 = await sharedDigest({ repo: t.repo, runId, boundDir: boundDir(state) });
    const line = validateLine({
      v: 1,
      kind: "orchestrator",
      run_id: runId,
      policyDigest: "d",
      helperPairs: helperPairsFrom({}),
    });
    if (line.kind !== "orchestrator") throw new Error("not an orchestrator line");
    const decision = decideSpawn(
      {
        session_id: "owner-1",
        hook_event_name: "PreToolUse",
        tool_name: "spawn_agent",
        tool_input: { message: "x" },
      },
      line,
      { spawnedBySubagent: false },
    );
    appendLedger(state, ledgerLine(decision, { owner: "owner-1", runId, policyDigest: "d" }));
    mkdirSync(join(boundDir(state), "claims"), { recursive: true });
    writeFileSync(join(boundDir(state), "claims", "op.json"), "{}");
    expect(await sharedDigest({ repo: t.repo, runId, boundDir: boundDir(state) })).toBe(d0);
  }, 30_000);
});

describe("trace warnings between bind and harvest", () => {
  it("a role that changes nothing and changed P is read_role_wrote (S000-115)", async () => {
    const atBind = await digests();
    writeFileSync(join(P, "notes.md"), "a reviewer wrote this\n");
    const atHarvest = await digests();
    expect(traceWarnings({ writes: false, atBind, atHarvest })).toEqual([
      {
        warning: "read_role_wrote",
        changed: ["workspace"],
        at_bind: { workspace: atBind.workspace },
        at_harvest: { workspace: atHarvest.workspace },
      },
    ]);
    // an executor writing its own workspace is what it is for
    expect(traceWarnings({ writes: true, atBind, atHarvest })).toEqual([]);
  }, 30_000);

  it("an executor that changed the owner's checkout is executor_wrote_outside (S000-116)", async () => {
    const atBind = await digests();
    writeFileSync(join(P, "impl.ts"), "ok\n");
    writeFileSync(join(t.repo, "oops.ts"), "written in the owner's checkout\n");
    const atHarvest = await digests();
    expect(traceWarnings({ writes: true, atBind, atHarvest }).map((w) => [w.warning, w.changed])).toEqual([
      ["executor_wrote_outside", ["outside"]],
    ]);
    expect(traceWarnings({ writes: false, atBind, atHarvest }).map((w) => [w.warning, w.changed])).toEqual([
      ["read_role_wrote", ["workspace", "outside"]],
    ]);
  }, 30_000);

  it("a changed shared digest is shared_state_changed, for any role (S000-117)", async () => {
    const atBind = await digests();
    t.sh(t.repo, "update-ref", "refs/crw/land/main", t.start);
    const atHarvest = await digests();
    for (const writes of [true, false])
      expect(traceWarnings({ writes, atBind, atHarvest }).map((w) => w.warning)).toEqual([
        "shared_state_changed",
      ]);
  }, 30_000);

  it("the digests record; nothing is refused or undone", async () => {
    const atBind: TraceDigests = await digests();
    writeFileSync(join(P, "x"), "x");
    const atHarvest = await digests();
    expect(traceWarnings({ writes: false, atBind, atHarvest })).toHaveLength(1);
    expect(t.sh(P, "status", "--porcelain")).toContain("x");
  }, 30_000);
});
