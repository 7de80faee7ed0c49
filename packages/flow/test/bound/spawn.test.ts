import { describe, expect, it } from "vitest";
import {
  decideSpawn,
  headerRole,
  hookOutput,
  type OrchestratorLine,
  opOf,
  type PreToolUseInput,
  validateLine,
} from "../../src/bound/index.js";

/** A bound owner's line: executor fully decided, reviewer with an undecided effort, explorer undecided. */
const line = validateLine({
  v: 1,
  kind: "orchestrator",
  run_id: "r1",
  policyDigest: "d1",
  helperPairs: {
    architect: { model: "m-arch", effort: "xhigh" },
    executor: { model: "m-exec", effort: "high" },
    "executor-t1": { model: "m-t1", effort: "low" },
    reviewer: { model: "m-rev" },
    explorer: {},
    critic: { model: "m-crit", effort: "medium" },
    "reviewer-final": { model: "m-retired", effort: "high" },
  },
}) as OrchestratorLine;

const spawnInput = (toolInput: Record<string, unknown>): PreToolUseInput => ({
  session_id: "owner-1",
  hook_event_name: "PreToolUse",
  tool_name: "spawn_agent",
  tool_input: toolInput,
  tool_use_id: "call_1",
});
const msg = (role: string, op = "build/t1-a1") =>
  `crw-flow-op: ${op}\nCRW-ROLE: ${role}\n\nYour shell starts in …`;
const decide = (toolInput: Record<string, unknown>, leaf = false) =>
  decideSpawn(spawnInput(toolInput), line, { spawnedBySubagent: leaf });

describe("the spawn hook's decision", () => {
  it("spawns are decided by the owner's orchestrator line (its pairs) (S000-274)", () => {
    const d = decide({
      message: msg("executor"),
      agent_type: "executor",
      model: "other",
      reasoning_effort: "low",
    });
    expect(d).toMatchObject({
      decision: "allow",
      role: "executor",
      applied: { model: "m-exec", effort: "high" },
    });
  });

  it("a spawn by a subagent (a leaf) is refused (S000-275)", () => {
    const d = decide({ message: msg("executor"), agent_type: "executor" }, true);
    expect(d).toMatchObject({ decision: "deny", reason: "leaf_spawn_refused" });
    expect(hookOutput(d)).toEqual({
      hookSpecificOutput: {
        hookEventName: "PreToolUse",
        permissionDecision: "deny",
        permissionDecisionReason: expect.stringMatching(/^leaf_spawn_refused/),
      },
    });
  });

  it("a full-history fork is refused with full_history_fork_refused (S000-276)", () => {
    const d = decide({ message: msg("reviewer"), fork_context: true, model: "m-rev" });
    expect(d).toMatchObject({ decision: "deny", reason: "full_history_fork_refused" });
    expect(d.message).toMatch(/keeps the parent's model/);
    expect(decide({ message: msg("reviewer"), fork_context: false }).decision).toBe("allow");
  });

  it("every other spawn is allowed with model and reasoning_effort overwritten from the role's pair (S000-277)", () => {
    const d = decide({
      message: msg("architect"),
      agent_type: "architect",
      model: "cheap",
      reasoning_effort: "minimal",
    });
    expect(hookOutput(d)).toEqual({
      hookSpecificOutput: {
        hookEventName: "PreToolUse",
        permissionDecision: "allow",
        updatedInput: {
          message: msg("architect"),
          agent_type: "architect",
          model: "m-arch",
          reasoning_effort: "xhigh",
        },
      },
    });
    // a spawn that named no pair at all gets the role's
    expect(decide({ message: msg("critic") }).updatedInput).toMatchObject({
      model: "m-crit",
      reasoning_effort: "medium",
    });
  });

  it("an undecided effort keeps the reasoning_effort the spawn was sent (S000-278)", () => {
    const d = decide({
      message: msg("reviewer"),
      agent_type: "reviewer",
      model: "x",
      reasoning_effort: "low",
    });
    expect(d.updatedInput).toMatchObject({ model: "m-rev", reasoning_effort: "low" });
    expect(d.applied).toEqual({ model: "m-rev", effort: "low" });
    const none = decide({ message: msg("reviewer"), agent_type: "reviewer" });
    expect(none.updatedInput).toEqual({ message: msg("reviewer"), agent_type: "reviewer", model: "m-rev" });
  });

  it("an undecided role keeps the whole spawn, with role_undecided (S000-279)", () => {
    const d = decide({
      message: msg("explorer"),
      agent_type: "explorer",
      model: "x",
      reasoning_effort: "low",
    });
    expect(d).toMatchObject({
      decision: "allow",
      role: "explorer",
      updatedInput: null,
      applied: { model: "x", effort: "low" },
    });
    expect(d.warnings).toContain("role_undecided");
    expect(hookOutput(d)).toBeNull();
  });

  it("the role is the first CRW-ROLE: line of the header when it is exactly one of the six (S000-280)", () => {
    expect(headerRole("crw-flow-op: a/t1-a1\nCRW-ROLE: executor-t1\nCRW-ROLE: architect\n\nbody")).toBe(
      "executor-t1",
    );
    expect(headerRole("crw-flow-op: a/t1-a1\n\nCRW-ROLE: architect")).toBeNull(); // not in the header
    expect(headerRole("CRW-ROLE: Executor")).toBeNull(); // not exactly one of the six
    // the first CRW-ROLE: line decides even when it names no role: a later one is never read
    expect(headerRole("CRW-ROLE: nobody\nCRW-ROLE: architect\n\nbody")).toBeNull();
    expect(headerRole("CRW-ROLE:   critic  \n")).toBe("critic");
    expect(decide({ message: msg("executor-t1"), agent_type: "executor" })).toMatchObject({
      role: "executor-t1",
      roleFrom: "header",
      applied: { model: "m-t1", effort: "low" },
    });
  });

  it("otherwise the agent_type's role (worker is executor), else explorer (S000-281)", () => {
    expect(decide({ message: "do it", agent_type: "worker" })).toMatchObject({
      role: "executor",
      roleFrom: "agent_type",
    });
    expect(decide({ message: "do it", agent_type: "architect" })).toMatchObject({
      role: "architect",
      roleFrom: "agent_type",
    });
    expect(decide({ message: "CRW-ROLE: nobody\n\nx", agent_type: "reviewer" })).toMatchObject({
      role: "reviewer",
    });
    expect(decide({ message: "do it", agent_type: "default" })).toMatchObject({
      role: "explorer",
      roleFrom: "default",
    });
    expect(decide({ message: "do it" })).toMatchObject({ role: "explorer", roleFrom: "default" });
  });

  it("the retired reviewerFinal pair is never applied: such a header role is no role (S000-256)", () => {
    const d = decide({ message: msg("reviewer-final"), agent_type: "reviewer", model: "x" });
    expect(d).toMatchObject({ role: "reviewer", roleFrom: "agent_type", applied: { model: "m-rev" } });
    expect(JSON.stringify(d)).not.toContain("m-retired");
  });

  it("the flow-bound header parser reads the op of the first line only", () => {
    expect(opOf("crw-flow-op: build/t2-a3\nCRW-ROLE: executor")).toBe("build/t2-a3");
    expect(opOf("hello\ncrw-flow-op: build/t2-a3")).toBeNull();
    expect(decide({ items: [{ type: "text", text: msg("critic", "c/t1-a1") }] })).toMatchObject({
      role: "critic",
      op: "c/t1-a1",
    });
  });

  it("role_agent_type_mismatch when the header role does not pair with the agent_type (S000-284)", () => {
    const warn = (role: string, agentType: string) =>
      decide({ message: msg(role), agent_type: agentType }).warnings.includes("role_agent_type_mismatch");
    expect(warn("executor-t1", "executor")).toBe(false);
    expect(warn("critic", "reviewer")).toBe(false);
    expect(warn("architect", "architect")).toBe(false);
    expect(warn("explorer", "explorer")).toBe(false);
    expect(warn("executor-t1", "executor-t1")).toBe(true);
    expect(warn("critic", "critic")).toBe(true);
    expect(warn("reviewer", "explorer")).toBe(true);
    expect(warn("executor", "worker")).toBe(true);
    // no agent_type: nothing to compare
    expect(decide({ message: msg("executor") }).warnings).toEqual([]);
  });

  it("unrecorded_spawn when the spawn carries no step marker (S000-285)", () => {
    expect(decide({ message: "CRW-ROLE: reviewer\n\nlook", agent_type: "reviewer" })).toMatchObject({
      op: null,
      warnings: ["unrecorded_spawn"],
    });
  });

  it("unrecorded_author when there is no marker and the type is an executor's or architect's (S000-286)", () => {
    for (const agentType of ["executor", "architect", "worker"])
      expect(decide({ message: "build it", agent_type: agentType }).warnings).toEqual(["unrecorded_author"]);
    expect(decide({ message: msg("executor"), agent_type: "executor" }).warnings).toEqual([]);
  });
});
