import { describe, expect, it } from "vitest";
import {
  decidedPair,
  decideSpawn,
  helperPairsFrom,
  parseBoundFile,
  serializeLine,
  validateLine,
} from "../../src/bound/index.js";

const five = { architect: {}, executor: { model: "m" }, "executor-t1": {}, reviewer: {}, explorer: {} };
const base = { v: 1, kind: "orchestrator", run_id: "r1", policyDigest: "d1", at: "2026-01-01T00:00:00.000Z" };

describe("orchestrator lines", () => {
  it("an orchestrator line carries kind, run_id, policyDigest and helperPairs (S000-252)", () => {
    const line = validateLine({ ...base, helperPairs: { ...five, critic: {} } });
    expect(line).toMatchObject({ kind: "orchestrator", run_id: "r1", policyDigest: "d1" });
    expect(line.kind === "orchestrator" && Object.keys(line.helperPairs).sort()).toEqual([
      "architect",
      "critic",
      "executor",
      "executor-t1",
      "explorer",
      "reviewer",
    ]);
    expect(() => validateLine({ ...base, policyDigest: undefined, helperPairs: five })).toThrow(
      /policyDigest/,
    );
    expect(() => validateLine({ ...base, run_id: "", helperPairs: five })).toThrow(/run_id/);
    expect(() => validateLine({ ...base, kind: "other", helperPairs: five })).toThrow(/kind/);
  });

  it("helperPairs from a role table cover the six roles (S000-253)", () => {
    const pairs = helperPairsFrom({
      architect: { model: "a", effort: null },
      executor: { model: "e", effort: "high" },
      "executor-t1": { model: null, effort: null },
      reviewer: { model: "r", effort: "low" },
      explorer: { model: null, effort: null },
      critic: { model: "c", effort: null },
    });
    expect(pairs).toEqual({
      architect: { model: "a" },
      executor: { model: "e", effort: "high" },
      "executor-t1": {},
      reviewer: { model: "r", effort: "low" },
      explorer: {},
      critic: { model: "c" },
    });
  });

  it("Line.Validate refuses an orchestrator line without any of the first five roles (S000-254)", () => {
    for (const role of Object.keys(five)) {
      const pairs: Record<string, unknown> = { ...five };
      delete pairs[role];
      expect(() => validateLine({ ...base, helperPairs: pairs })).toThrow(
        new RegExp(`without helperPairs for ${role}`),
      );
    }
    expect(() => validateLine({ ...base })).toThrow(/no helperPairs/);
  });

  it("the critic is optional: an earlier crw's line without it reads, and a critic spawn under it is kept as sent, undecided (S000-255)", () => {
    // the reviewer decides a pair: a critic (spawned as a reviewer) must not borrow it
    const line = validateLine({
      ...base,
      helperPairs: { ...five, reviewer: { model: "m-rev", effort: "high" } },
    });
    if (line.kind !== "orchestrator") throw new Error("not an orchestrator line");
    expect(line.helperPairs.critic).toBeUndefined();
    const d = decideSpawn(
      {
        session_id: "owner-1",
        hook_event_name: "PreToolUse",
        tool_name: "spawn_agent",
        tool_input: {
          message: "crw-flow-op: crit/t1-a1\nCRW-ROLE: critic\n\nYour shell starts in …",
          agent_type: "reviewer",
          model: "sent-model",
          reasoning_effort: "low",
        },
        tool_use_id: "call_1",
      },
      line,
      { spawnedBySubagent: false },
    );
    expect(d).toMatchObject({
      decision: "allow",
      role: "critic",
      pair: {},
      applied: { model: "sent-model", effort: "low" },
      updatedInput: null,
    });
    expect(d.warnings).toContain("role_undecided");
  });

  it("a pair under the retired reviewerFinal key is read, kept, and is no role's pair (S000-256)", () => {
    const line = validateLine({
      ...base,
      helperPairs: { ...five, "reviewer-final": { model: "old", effort: "high" } },
    });
    if (line.kind !== "orchestrator") throw new Error("not an orchestrator line");
    expect(line.retiredPairs).toEqual({ "reviewer-final": { model: "old", effort: "high" } });
    expect(Object.keys(line.helperPairs)).not.toContain("reviewer-final");
    // written back as the earlier crw wrote it
    expect(JSON.parse(serializeLine(line)).helperPairs["reviewer-final"]).toEqual({
      model: "old",
      effort: "high",
    });
  });

  it("a pair carries only the decided parts: {} undecided, {model} with an undecided effort (S000-257)", () => {
    expect(decidedPair(null, null)).toEqual({});
    expect(decidedPair("m", null)).toEqual({ model: "m" });
    expect(decidedPair("m", "high")).toEqual({ model: "m", effort: "high" });
    const line = validateLine({ ...base, helperPairs: { ...five, reviewer: { model: "r" } } });
    expect(line.kind === "orchestrator" && line.helperPairs.reviewer).toEqual({ model: "r" });
    expect(() =>
      validateLine({ ...base, helperPairs: { ...five, reviewer: { model: "r", extra: 1 } } }),
    ).toThrow();
  });

  it("an effort without a model is no role's pair (S000-258)", () => {
    expect(() => decidedPair(null, "high")).toThrow(/effort without a model/);
    expect(() => validateLine({ ...base, helperPairs: { ...five, explorer: { effort: "high" } } })).toThrow(
      /effort without a model/,
    );
  });

  it("a torn last line is ignored; a bad line before the last is an error; an invalid last line is reported", () => {
    const good = JSON.stringify({ ...base, helperPairs: five });
    expect(parseBoundFile(`${good}\n{"v":1,"kind":"clo`)).toMatchObject({ torn: true, invalidLast: null });
    expect(parseBoundFile(`${good}\n{"v":1,"kind":"clo`).lines).toHaveLength(1);
    expect(() => parseBoundFile(`nope\n${good}\n`)).toThrow(/line 1 is bad/);
    expect(parseBoundFile(`${good}\n${JSON.stringify({ ...base, helperPairs: {} })}\n`).invalidLast).toMatch(
      /without helperPairs/,
    );
  });
});
