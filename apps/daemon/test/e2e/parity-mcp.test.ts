import { DEFAULT_CATALOG_POLICY, TOOL_CALL, TOOL_SEARCH } from "@crw/brain";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type Captured,
  declaredNames,
  normalize,
  type ParityRun,
  runParitySession,
} from "./parity-harness.js";

/**
 * test:e2e:parity:mcp. The real daemon (`startDaemon`) with a real MCP server process (stdio, the official
 * SDK) in its configuration, bridged into every session's tools; a root session created and prompted through
 * the daemon's API delegates a child (in a forked runner by default, in the daemon with runners off), and
 * the child finds the server's adder and calls it. Every provider request is captured where the
 * provider receives it (the loopback server speaking the Chat Completions wire protocol). Two variants:
 * a two-tool and a twelve-tool server.
 */
const db = useTestDatabase();

const NATIVE_DEFERRED = ["WorkflowResume", "WorkflowCancel"];
const bridged = (count: number) => [
  "mcp__calc__add",
  "mcp__calc__echo",
  ...Array.from({ length: count - 2 }, (_, i) => `mcp__calc__probe_${String(i + 3).padStart(2, "0")}`),
];

function firstOf(run: ParityRun, role: Captured["role"]): Captured {
  const c = run.captured.find((x) => x.role === role && x.step === 0);
  if (!c) throw new Error(`no ${role} request captured`);
  return c;
}

function toolCallEnum(c: Captured): string[] {
  const call = c.body.tools?.find((t) => t.function.name === TOOL_CALL);
  const parameters = call?.function.parameters as { properties?: { name?: { enum?: string[] } } } | undefined;
  return [...(parameters?.properties?.name?.enum ?? [])];
}

async function variant(count: number) {
  const runner = await runParitySession({
    url: db.url,
    pool: db.pool,
    runnerEnabled: true,
    mcp: { calc: count },
  });
  const local = await runParitySession({
    url: db.url,
    pool: db.pool,
    runnerEnabled: false,
    mcp: { calc: count },
  });
  return { runner, local };
}

function assertVariant(count: number, { runner, local }: Awaited<ReturnType<typeof variant>>) {
  const expected = bridged(count);
  // Runner use, unconditionally: the child's turns ran in the runner by default, in the daemon when off.
  expect(runner.placements.runner).toBeGreaterThan(0);
  expect(local.placements.runner).toBe(0);

  const child = firstOf(runner, "child");
  // The child's complete catalog (7 native host tools + the bridged tools; it has no working directory, so
  // no child tools) exceeds the threshold: the bridged names are deferred, never declared directly...
  expect(7 + count).toBeGreaterThan(DEFAULT_CATALOG_POLICY.maxDirectTools);
  const declared = declaredNames(child);
  expect(declared).toEqual([
    "Delegate",
    "DelegateContinue",
    "DelegateRead",
    "WorkflowStart",
    "WorkflowRead",
    TOOL_SEARCH,
    TOOL_CALL,
  ]);
  for (const name of expected) expect(declared).not.toContain(name);
  // ...and every expected name reaches the child in its provider request: ToolCall's name enum and
  // ToolSearch's description list the whole deferred catalog.
  expect(toolCallEnum(child)).toEqual([...NATIVE_DEFERRED, ...expected]);
  const search = child.body.tools?.find((t) => t.function.name === TOOL_SEARCH);
  for (const name of expected) expect(search?.function.description).toContain(name);

  // The child found the adder through the deferred catalog and the real server's answer reached it.
  const last = runner.captured.filter((c) => c.role === "child").at(-1) as Captured;
  const toolMessages = (last.body.messages ?? [])
    .filter((m) => m.role === "tool")
    .map((m) => String(m.content));
  expect(toolMessages.some((m) => m.includes('"name": "mcp__calc__add"'))).toBe(true);
  expect(toolMessages.some((m) => /^5 \(pid \d+\)$/.test(m))).toBe(true);

  // The root (same catalog, in the daemon) defers the same names: the policy is one for every session.
  const root = firstOf(runner, "root");
  expect(declaredNames(root)).toEqual(declared);
  expect(toolCallEnum(root)).toEqual([...NATIVE_DEFERRED, ...expected]);

  // Runner and daemon placements send byte-identical provider requests (ids normalized), turn by turn,
  // and leave identical transcripts.
  expect(normalize(runner.captured)).toEqual(normalize(local.captured));
  expect(normalize(runner.transcripts)).toEqual(normalize(local.transcripts));
}

describe("test:e2e:parity:mcp", () => {
  it("two-tool MCP server: the unresolved catalog exceeds the threshold, the bridged names are deferred (root and child), every expected name reaches the child, runner = daemon (S004-450)", async () => {
    assertVariant(2, await variant(2));
  }, 120_000);

  it("twelve-tool MCP server: bridged names deferred in the child and in the root, every expected name reaches the child, runner = daemon (S004-450)", async () => {
    assertVariant(12, await variant(12));
  }, 120_000);

  it("the daemon's tools section sets the policy: with maxDirectTools above the catalog the bridged names are declared directly and called by name", async () => {
    const run = await runParitySession({
      url: db.url,
      pool: db.pool,
      runnerEnabled: true,
      mcp: { calc: 2 },
      tools: { maxDirectTools: 20 },
    });
    expect(run.placements.runner).toBeGreaterThan(0);
    const child = firstOf(run, "child");
    expect(declaredNames(child)).toEqual([
      "Delegate",
      "DelegateContinue",
      "DelegateRead",
      "WorkflowStart",
      "WorkflowResume",
      "WorkflowCancel",
      "WorkflowRead",
      ...bridged(2),
    ]);
    expect(declaredNames(child)).not.toContain(TOOL_SEARCH);
    const last = run.captured.filter((c) => c.role === "child").at(-1) as Captured;
    const results = (last.body.messages ?? []).filter((m) => m.role === "tool").map((m) => String(m.content));
    expect(results.some((m) => /^5 \(pid \d+\)$/.test(m))).toBe(true);
  }, 120_000);
});
