import { describe, expect, it } from "vitest";
import type { SessionTurnRunner, TurnRequest, TurnTool } from "../../delegation/index.js";
import { scopedTools } from "../../delegation/index.js";
import { captureDelegatedExecutionScope, parseDelegatedExecutionScope } from "../../scope/index.js";
import {
  CatalogError,
  catalogNames,
  catalogPolicyFingerprint,
  catalogPolicyFrom,
  DEFAULT_CATALOG_POLICY,
  planCatalog,
  TOOL_CALL,
  TOOL_SEARCH,
  withToolCatalog,
} from "./index.js";

const tool = (
  name: string,
  description = `the ${name} tool`,
  mutates = false,
): TurnTool & { mutates: boolean } => ({
  name,
  description,
  parameters: { type: "object", properties: { x: { type: "string" } } },
  mutates,
  async execute(args) {
    return { content: `${name} ran with ${JSON.stringify(args)}` };
  },
});

const native = [
  "Delegate",
  "DelegateContinue",
  "DelegateRead",
  "WorkflowStart",
  "WorkflowResume",
  "WorkflowCancel",
  "WorkflowRead",
];

function request(
  tools: TurnTool[],
  opts: { workDir?: string | null; readOnly?: boolean; deny?: string[] } = {},
) {
  const workDir = opts.workDir === undefined ? "/tmp" : opts.workDir;
  const scope =
    workDir === null
      ? null
      : parseDelegatedExecutionScope(
          captureDelegatedExecutionScope({
            accountId: "acc",
            target: { kind: "host", ref: null },
            workDir,
            ...(opts.deny ? { tools: { deny: opts.deny } } : {}),
          }),
        );
  const r: TurnRequest = {
    sessionId: "s",
    principalAccountId: "acc",
    model: "scripted",
    systemPrompt: "p",
    context: [{ role: "user", content: "hi" }],
    tools: scopedTools(tools, scope, opts.readOnly ?? false),
    scope,
    readOnly: opts.readOnly ?? false,
    workDir,
    signal: new AbortController().signal,
  };
  return r;
}

/** The inner placement: records what it was handed and can call a tool of it. */
function capture() {
  const seen: TurnRequest[] = [];
  const runner: SessionTurnRunner = {
    async runTurn(r) {
      seen.push(r);
      return { stopReason: "stop" };
    },
  };
  return { seen, runner };
}

const ctx = (r: TurnRequest) => ({
  sessionId: r.sessionId,
  principalAccountId: r.principalAccountId,
  toolCallId: "c1",
  readOnly: r.readOnly,
  workDir: r.workDir,
  signal: r.signal,
  progress: () => {},
});

describe("the shared whole-catalog deferral policy", () => {
  it("declares the whole catalog while it stays within the threshold, and counts child tools and host tools together", async () => {
    const { seen, runner } = capture();
    const root = request(
      [...native, "mcp__srv__one"].map((n) => tool(n)),
      { workDir: null },
    );
    expect(catalogNames(root)).toEqual([...native, "mcp__srv__one"]);
    await withToolCatalog(runner).runTurn(root, {} as never);
    expect(seen[0]?.tools.map((t) => t.name)).toEqual([...native, "mcp__srv__one"]);
    const child = request(native.map((n) => tool(n)));
    expect(catalogNames(child)).toEqual(["read", "write", "edit", "shell", "ls", "find", "grep", ...native]);
    expect(planCatalog(catalogNames(child)).deferring).toBe(true);
  });

  it("past the threshold, native tools outside the locked core set and bridged tools are deferred but discoverable, and the model-only tools stay declared (S004-448)", async () => {
    const { seen, runner } = capture();
    const r = request([
      ...native.map((n) => tool(n)),
      tool("mcp__srv__add", "Add two integers"),
      tool("mcp__srv__echo"),
    ]);
    await withToolCatalog(runner).runTurn(r, {} as never);
    const sent = seen[0] as TurnRequest;
    expect(sent.tools.map((t) => t.name)).toEqual([
      "Delegate",
      "DelegateContinue",
      "DelegateRead",
      "WorkflowStart",
      "WorkflowRead",
      TOOL_SEARCH,
      TOOL_CALL,
    ]);
    const search = sent.tools.find((t) => t.name === TOOL_SEARCH) as TurnTool;
    expect(search.description).toContain(
      "Deferred tools: WorkflowResume, WorkflowCancel, mcp__srv__add, mcp__srv__echo.",
    );
    const call = sent.tools.find((t) => t.name === TOOL_CALL) as TurnTool;
    expect((call.parameters as { properties: { name: { enum: string[] } } }).properties.name.enum).toEqual([
      "WorkflowResume",
      "WorkflowCancel",
      "mcp__srv__add",
      "mcp__srv__echo",
    ]);
    // Discoverable: a keyword search and an exact-name search return schemas.
    const byKeyword = await search.execute({ query: "add integers" }, ctx(sent));
    expect(JSON.parse(byKeyword.content).tools.map((t: { name: string }) => t.name)).toEqual([
      "mcp__srv__add",
    ]);
    const byName = await search.execute({ query: "WorkflowCancel, mcp__srv__echo" }, ctx(sent));
    expect(JSON.parse(byName.content).tools).toEqual([
      { name: "WorkflowCancel", description: "the WorkflowCancel tool", parameters: expect.any(Object) },
      { name: "mcp__srv__echo", description: "the mcp__srv__echo tool", parameters: expect.any(Object) },
    ]);
    // Callable: ToolCall runs the deferred tool itself.
    const out = await call.execute({ name: "mcp__srv__add", arguments: { x: "1" } }, ctx(sent));
    expect(out.content).toBe('mcp__srv__add ran with {"x":"1"}');
    await expect(call.execute({ name: "nope", arguments: {} }, ctx(sent))).rejects.toMatchObject({
      name: "CatalogError",
      code: "unknown_deferred_tool",
    });
  });

  it("a deferred tool called through ToolCall keeps its scope and read-only checks", async () => {
    const { seen, runner } = capture();
    const tools = [
      ...native.map((n) => tool(n)),
      tool("mcp__srv__write", "writes", true),
      { ...tool("mcp__srv__ro"), subject: (a: Readonly<Record<string, unknown>>) => String(a.x) },
      tool("mcp__srv__other"),
    ];
    await withToolCatalog(runner).runTurn(
      request(tools, { readOnly: true, deny: ["mcp__srv__ro(secret*)", "mcp__srv__other"] }),
      {} as never,
    );
    const sent = seen[0] as TurnRequest;
    const call = sent.tools.find((t) => t.name === TOOL_CALL) as TurnTool;
    await expect(call.execute({ name: "mcp__srv__write", arguments: {} }, ctx(sent))).rejects.toMatchObject({
      code: "tool_not_allowed",
    });
    await expect(
      call.execute({ name: "mcp__srv__ro", arguments: { x: "secret.txt" } }, ctx(sent)),
    ).rejects.toMatchObject({ code: "tool_not_allowed" });
    // A tool the scope denies outright is not in the catalog at all.
    await expect(call.execute({ name: "mcp__srv__other", arguments: {} }, ctx(sent))).rejects.toMatchObject({
      code: "unknown_deferred_tool",
    });
  });

  it("the plan depends on names only: the same names give the same declared prefix, and a root session without child tools counts only its own", () => {
    const names = [...native, "mcp__a__x", "mcp__a__y"];
    expect(planCatalog(names)).toEqual(planCatalog([...names]));
    const root = request(
      names.map((n) => tool(n)),
      { workDir: null },
    );
    expect(catalogNames(root)).toEqual(names);
    expect(planCatalog(catalogNames(root)).deferred).toEqual([
      "WorkflowResume",
      "WorkflowCancel",
      "mcp__a__x",
      "mcp__a__y",
    ]);
    expect(planCatalog(native).deferring).toBe(false);
  });

  it("refuses a policy that would defer a child tool or declare a model-only tool as core, with a typed error", () => {
    expect(() => catalogPolicyFrom({ maxDirectTools: -1 })).toThrow(CatalogError);
    const bad = { ...DEFAULT_CATALOG_POLICY, core: ["Delegate"] };
    expect(() => withToolCatalog(capture().runner, bad)).toThrow(/child tools/);
    expect(catalogPolicyFrom({ maxDirectTools: 3, core: ["WorkflowCancel"] })).toMatchObject({
      maxDirectTools: 3,
      core: expect.arrayContaining(["read", "WorkflowCancel"]),
    });
  });

  it("the policy fingerprint changes with the threshold, the core set or the deferred catalog's texts", () => {
    const base = catalogPolicyFingerprint().digest;
    expect(catalogPolicyFingerprint(catalogPolicyFrom({ maxDirectTools: 11 })).digest).not.toBe(base);
    expect(catalogPolicyFingerprint(catalogPolicyFrom({ core: ["X"] })).digest).not.toBe(base);
    expect(catalogPolicyFingerprint(catalogPolicyFrom({})).digest).toBe(base);
  });
});
