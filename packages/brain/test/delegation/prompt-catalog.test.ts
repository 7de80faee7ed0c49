import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  applyCatalog,
  catalogPolicyFrom,
  createScriptedTurnRunner,
  type MutatingTool,
  type SessionTurnRunner,
  TOOL_CALL,
  TOOL_SEARCH,
  type TurnRequest,
  withToolCatalog,
} from "../../src/index.js";
import { makeService, newParent } from "./helpers.js";

const db = useTestDatabase();
const EXTRA = [
  "mcp__calc__add",
  "mcp__calc__sub",
  "mcp__calc__mul",
  "mcp__calc__div",
  "mcp__calc__mod",
  "mcp__calc__pow",
];

const hostTool = (name: string): MutatingTool => ({
  name,
  description: `${name} does its one thing (unique phrase ${name.toLowerCase()}-desc)`,
  parameters: { type: "object", properties: {} },
  async execute() {
    return { content: `${name} ran` };
  },
});

/** The `# Tools` section of a composed prompt, as `name` lines. */
const listed = (prompt: string) =>
  [...(prompt.split("# Tools\n")[1] ?? "").matchAll(/^- ([^:\n]+):/gm)].map((m) => m[1]);

function recordingCatalog(policy = catalogPolicyFrom()) {
  const seen: TurnRequest[] = [];
  const base = createScriptedTurnRunner();
  const inner: SessionTurnRunner = {
    runTurn: (request, host) => {
      seen.push(request);
      return base.runTurn(request, host);
    },
  };
  return { seen, runner: withToolCatalog(inner, policy), policy };
}

describe("the session prompt follows the tool catalog", () => {
  it("a deferred tool is not described in the prompt; the prompt names what the request declares and stays byte-stable", async () => {
    const { seen, runner } = recordingCatalog();
    // Six bridged host tools: the root's catalog (Delegate and friends plus these) exceeds the threshold.
    let extra = EXTRA;
    const { service, repo } = makeService(db.pool, { runner, tools: () => extra.map(hostTool) });
    const { account, parent } = await newParent(service);
    await service.prompt(parent.id, account.id, "first");
    const first = seen[0] as TurnRequest;
    const names = listed(first.systemPrompt);
    // Declared directly: the core native tools and the deferred catalog's own two tools.
    const declared = first.tools.map((t) => t.name);
    expect(declared).toContain(TOOL_SEARCH);
    expect(names).toEqual(declared);
    expect(names).toEqual(["Delegate", "DelegateContinue", "DelegateRead", TOOL_SEARCH, TOOL_CALL]);
    for (const deferred of extra) {
      expect(names).not.toContain(deferred);
      expect(first.systemPrompt).not.toContain(`${deferred.toLowerCase()}-desc`);
    }
    // ToolSearch is described by its fixed text, not by the list of deferred names it carries.
    expect(first.systemPrompt).not.toContain("Deferred tools:");
    const search = first.tools.find((t) => t.name === TOOL_SEARCH);
    expect(search?.description).toContain("mcp__calc__add");

    // Later turns (even with another tool set) reuse the stored bytes.
    extra = ["mcp__calc__add"];
    await service.prompt(parent.id, account.id, "second");
    expect(seen[1]?.systemPrompt).toBe(first.systemPrompt);
    expect((await repo.getSession(parent.id, account.id)).systemPrompt).toBe(first.systemPrompt);
  });

  it("below the threshold every tool is described, byte for byte as without a catalog", async () => {
    const withCatalog = recordingCatalog();
    const a = makeService(db.pool, { runner: withCatalog.runner });
    const pa = await newParent(a.service);
    await a.service.prompt(pa.parent.id, pa.account.id, "hi");
    const plain = makeService(db.pool, { runner: createScriptedTurnRunner() });
    const pb = await newParent(plain.service);
    await plain.service.prompt(pb.parent.id, pb.account.id, "hi");
    const promptA = (await a.repo.getSession(pa.parent.id, pa.account.id)).systemPrompt;
    const promptB = (await plain.repo.getSession(pb.parent.id, pb.account.id)).systemPrompt;
    expect(promptA).toBe(promptB);
    const request = withCatalog.seen[0] as TurnRequest;
    expect(applyCatalog(request).plan.deferring).toBe(false);
    expect(listed(promptA ?? "")).toEqual(request.tools.map((t) => t.name));
  });

  it("the policy is the host's: a raised threshold, or catalogPolicy: null, describes every tool", async () => {
    const extra = EXTRA;
    const raised = recordingCatalog(catalogPolicyFrom({ maxDirectTools: 50 }));
    const a = makeService(db.pool, { runner: raised.runner, tools: () => extra.map(hostTool) });
    const pa = await newParent(a.service);
    await a.service.prompt(pa.parent.id, pa.account.id, "hi");
    expect(listed(raised.seen[0]?.systemPrompt ?? "")).toEqual(expect.arrayContaining(extra));

    const deferring = recordingCatalog();
    const b = makeService(db.pool, {
      runner: deferring.runner,
      tools: () => extra.map(hostTool),
      catalogPolicy: null,
    });
    const pb = await newParent(b.service);
    await b.service.prompt(pb.parent.id, pb.account.id, "hi");
    const prompt = deferring.seen[0]?.systemPrompt ?? "";
    expect(deferring.seen[0]?.tools.map((t) => t.name)).toContain(TOOL_CALL);
    expect(listed(prompt)).toEqual(["Delegate", "DelegateContinue", "DelegateRead", ...extra]);
    expect(listed(prompt)).not.toContain(TOOL_CALL);
  });
});
