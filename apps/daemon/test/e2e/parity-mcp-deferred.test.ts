import { resolve } from "node:path";
import {
  catalogPolicyFingerprint,
  catalogPolicyFrom,
  DEFAULT_CATALOG_POLICY,
  PERSONA_TEMPLATES,
  TOOL_CALL,
  TOOL_SEARCH,
} from "@crw/brain";
import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  BaselineMigrationError,
  checkedBaseline,
  digestOf,
  forkProof,
  migrateBaseline,
  type Prefix,
  prefixDelta,
} from "./parity-baseline.js";
import { type Captured, declaredNames, normalize, runParitySession } from "./parity-harness.js";

/**
 * test:e2e:parity:mcp:deferred. The deferred catalog end to end on the real daemon (`startDaemon`), pinned:
 * a twelve-tool MCP server from the daemon's configuration bridged into every session, the child (in a forked runner) finds and calls a deferred tool, then forks once.
 * The fingerprints pin the persona templates, the shared whole-catalog deferral policy (and the deferred
 * catalog's own texts), the typed context records the run journaled, and every provider request prefix,
 * against parity-mcp-deferred-baseline.json. The fork's first provider request must repeat its parent's
 * system prompt, declared tools and message prefix byte for byte (the same-build fork proof every baseline
 * migration needs).
 */
const db = useTestDatabase();
const baselinePath = resolve(import.meta.dirname, "parity-mcp-deferred-baseline.json");

type Body = Captured["body"] & { messages?: { role: string; content?: unknown }[] };
const systemOf = (b: Body) => (b.messages ?? []).filter((m) => m.role === "system" || m.role === "developer");
const contextOf = (b: Body) =>
  (b.messages ?? []).filter((m) => m.role !== "system" && m.role !== "developer");

function prefixOf(c: Captured): Prefix {
  const body = normalize(c.body) as Body;
  return {
    system: JSON.stringify(systemOf(body)),
    tools: Object.fromEntries((body.tools ?? []).map((t) => [t.function.name, JSON.stringify(t)])),
    context: JSON.stringify(contextOf(body)),
  };
}

function pinnedOf(transcripts: unknown[], policy = catalogPolicyFingerprint().digest) {
  return {
    personaTemplates: digestOf(PERSONA_TEMPLATES),
    catalogPolicy: policy,
    contextRecords: digestOf(normalize(transcripts)),
  };
}

/**
 * One session on the real daemon with a twelve-tool MCP server: its child (in a forked runner) searches the
 * deferred catalog, calls the MCP adder through ToolCall and forks once. Every provider request is captured;
 * the pinned fingerprints, the prefixes and the fork proof are computed from them and checked against the
 * stored baseline once.
 */
describe("test:e2e:parity:mcp:deferred", () => {
  let run: Awaited<ReturnType<typeof runParitySession>>;
  let child: Captured[];
  let fork: Captured[];
  let proof: ReturnType<typeof forkProof>;
  let current: {
    prefixes: Record<string, Prefix>;
    pinned: ReturnType<typeof pinnedOf>;
    turns: Record<string, string>;
  };
  let baseline: ReturnType<typeof checkedBaseline>;
  const body = (c: Captured) => c.body as Body;
  const toolOf = (c: Captured, name: string) => (body(c).tools ?? []).find((t) => t.function.name === name);

  beforeAll(async () => {
    run = await runParitySession({
      url: db.url,
      pool: db.pool,
      runnerEnabled: true,
      mcp: { calc: 12 },
      fork: true,
    });
    child = run.captured.filter((c) => c.role === "child");
    fork = run.captured.filter((c) => c.role === "fork");
    // The same-build fork: its first request (captured at the provider) against the child's request that
    // asked for it.
    const asked = child[2] as Captured;
    proof = forkProof(
      {
        key: "child:2",
        system: systemOf(body(asked)),
        tools: body(asked).tools,
        messages: contextOf(body(asked)),
      },
      {
        key: "fork:0",
        system: systemOf(body(fork[0] as Captured)),
        tools: body(fork[0] as Captured).tools,
        messages: contextOf(body(fork[0] as Captured)),
      },
    );
    const prefixes = Object.fromEntries(run.captured.map((c) => [`${c.role}:${c.step}`, prefixOf(c)]));
    current = {
      prefixes,
      pinned: pinnedOf(run.transcripts),
      turns: Object.fromEntries(Object.entries(prefixes).map(([k, p]) => [k, digestOf(p)])),
    };
    baseline = checkedBaseline(baselinePath, current, proof);
  }, 120_000);

  it("the child runs in a forked runner, finds the deferred MCP adder and calls it, then forks once", () => {
    expect(run.placements.runner).toBeGreaterThan(0);
    expect(child.map((c) => c.step)).toEqual([0, 1, 2, 3]);
    expect(fork.map((c) => c.step)).toEqual([0]);
    const found = (child[1]?.body.messages ?? [])
      .filter((m) => m.role === "tool")
      .map((m) => String(m.content));
    expect(found.join("\n")).toContain('"name": "mcp__calc__add"');
  });

  it("the pinned fingerprints are those of the current persona templates, deferral policy and context records, as stored (S004-447)", () => {
    expect(current.pinned).toEqual({
      personaTemplates: digestOf(PERSONA_TEMPLATES),
      catalogPolicy: catalogPolicyFingerprint().digest,
      contextRecords: digestOf(normalize(run.transcripts)),
    });
    expect(baseline.pinned).toEqual(current.pinned);
    expect(
      prefixDelta(baseline, current),
      "the pinned fingerprints or provider request prefixes changed: migrate the baseline (CRW_PARITY_UPDATE=1 with a reason naming the delta)",
    ).toEqual([]);
    expect(current.turns).toEqual(baseline.turns);
  });

  it("native tools outside the locked core set are not declared but listed in the deferred catalog and callable by name (S004-448)", () => {
    const first = child[0] as Captured;
    const declared = declaredNames(first);
    const description = String(toolOf(first, TOOL_SEARCH)?.function.description);
    const listed = (/Deferred tools: ([^\n]*)\./.exec(description)?.[1] ?? "").split(", ");
    const call = toolOf(first, TOOL_CALL) as unknown as {
      function: { parameters: { properties: { name: { enum: string[] } } } };
    };
    const callable = call.function.parameters.properties.name.enum;
    const nativeDeferred = listed.filter((n) => !n.startsWith("mcp__"));
    expect(nativeDeferred).toEqual(["WorkflowResume", "WorkflowCancel"]);
    for (const name of nativeDeferred) {
      expect(DEFAULT_CATALOG_POLICY.core).not.toContain(name);
      expect(declared).not.toContain(name);
      expect(callable).toContain(name);
    }
    // Every declared tool is core or model-only: nothing outside the core set is declared.
    expect(
      declared.filter(
        (n) => !DEFAULT_CATALOG_POLICY.core.includes(n) && !DEFAULT_CATALOG_POLICY.modelOnly.includes(n),
      ),
    ).toEqual([]);
  });

  it("the model-only catalog tools stay declared directly, after the core tools", () => {
    expect(declaredNames(child[0] as Captured)).toEqual([
      "Delegate",
      "DelegateContinue",
      "DelegateRead",
      "WorkflowStart",
      "WorkflowRead",
      TOOL_SEARCH,
      TOOL_CALL,
    ]);
  });

  it("the stored baseline carries a reason and a same-build fork proof, which this run's provider capture repeats byte for byte (S004-451)", () => {
    expect(proof).toMatchObject({
      systemIdentical: true,
      toolsIdentical: true,
      messagePrefixIdentical: true,
    });
    expect(proof.prefixMessages).toBeGreaterThan(1);
    expect(baseline.reason.length).toBeGreaterThan(0);
    expect(baseline.forkProof).toMatchObject({
      systemIdentical: true,
      toolsIdentical: true,
      messagePrefixIdentical: true,
    });
  });
  it("a baseline migrates only with a reason naming the exact delta and a passing same-build fork proof; a new capture alone is refused (S004-451 S004-452)", () => {
    const prefix: Prefix = { system: "s", tools: { Delegate: "d", ToolSearch: "t" }, context: "c" };
    const previous = {
      reason: "first",
      updatedAt: "",
      delta: [],
      forkProof: undefined as never,
      pinned: { catalogPolicy: "p1" },
      turns: {},
      prefixes: { "child:0": prefix },
    };
    const changed = {
      pinned: { catalogPolicy: "p2" },
      turns: {},
      prefixes: { "child:0": { ...prefix, tools: { ...prefix.tools, Delegate: "d2" } } },
    };
    const proof = forkProof(
      { key: "p", system: "s", tools: [1], messages: ["a"] },
      { key: "f", system: "s", tools: [1], messages: ["a", "b"] },
    );
    const refused = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e instanceof BaselineMigrationError ? e.code : e;
      }
      return "accepted";
    };
    // A new capture alone (no fork proof) does not establish parity, whatever the reason says.
    expect(
      refused(() =>
        migrateBaseline({
          previous,
          current: changed,
          reason: "Delegate and catalogPolicy changed",
          forkProof: undefined,
        }),
      ),
    ).toBe("fork_proof_missing");
    const broken = forkProof(
      { key: "p", system: "s", tools: [1], messages: ["a"] },
      { key: "f", system: "s", tools: [2], messages: ["a", "b"] },
    );
    expect(
      refused(() =>
        migrateBaseline({ previous, current: changed, reason: "Delegate catalogPolicy", forkProof: broken }),
      ),
    ).toBe("fork_not_identical");
    expect(refused(() => migrateBaseline({ previous, current: changed, reason: "", forkProof: proof }))).toBe(
      "reason_missing",
    );
    // The reason must name every changed part: here the Delegate tool and the pinned catalog policy.
    expect(
      refused(() =>
        migrateBaseline({ previous, current: changed, reason: "Delegate got a field", forkProof: proof }),
      ),
    ).toBe("reason_incomplete");
    const next = migrateBaseline({
      previous,
      current: changed,
      reason: "Delegate got a field; catalogPolicy threshold raised",
      forkProof: proof,
    });
    expect(next.delta).toEqual(["tool Delegate @ child:0", "pinned catalogPolicy"]);
    expect(next.forkProof).toBe(proof);
  });
});

describe("the parity fingerprints", () => {
  it("move with the persona templates, every member of the deferral policy and the context records (S004-447)", () => {
    const base = pinnedOf([{ role: "user", content: "x" }]);
    expect(pinnedOf([{ role: "user", content: "x" }])).toEqual(base);
    expect(pinnedOf([{ role: "user", content: "y" }]).contextRecords).not.toBe(base.contextRecords);
    const policy = DEFAULT_CATALOG_POLICY;
    const changed = {
      version: { ...policy, version: policy.version + 1 },
      maxDirectTools: catalogPolicyFrom({ maxDirectTools: 9 }),
      core: catalogPolicyFrom({ core: ["Read"] }),
      modelOnly: { ...policy, modelOnly: policy.modelOnly.slice(1) },
    };
    for (const [member, other] of Object.entries(changed)) {
      expect(other, member).not.toEqual(policy);
      expect(
        pinnedOf([{ role: "user", content: "x" }], catalogPolicyFingerprint(other).digest).catalogPolicy,
        member,
      ).not.toBe(base.catalogPolicy);
    }
    expect(digestOf({ ...PERSONA_TEMPLATES, "crw-engineering": "changed" })).not.toBe(base.personaTemplates);
    const previous = { prefixes: {}, pinned: base };
    expect(prefixDelta(previous, { prefixes: {}, pinned: { ...base, personaTemplates: "other" } })).toEqual([
      "pinned personaTemplates",
    ]);
  });
});
