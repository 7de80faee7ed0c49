import { bearsUsage, type ProviderUsage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createAgentTurnRunner,
  forkPrefixDiagnostics,
  modelConfigFor,
  newestUsageBearingResponse,
  type ProviderUsageReport,
} from "../../src/index.js";
import { PromptCacheModel, startFakeModelServer } from "../agent/fake-model-server.js";
import { makeService, messages } from "./helpers.js";

const db = useTestDatabase();
const MODEL = "anthropic-messages:claude-fake-1";

/** Raw assistant rows of a session: the stored JSON text and the usage column beside it. */
async function assistantRows(sessionId: string) {
  const { rows } = await db.pool.query<{ seq: string; body: string; provider_usage: ProviderUsage | null }>(
    `select seq, body, provider_usage from journal_entries
      where session_id = $1 and role = 'assistant' order by seq`,
    [sessionId],
  );
  return rows.map((r) => ({ seq: Number(r.seq), body: r.body, usage: r.provider_usage }));
}

async function forkScenario(cache: PromptCacheModel) {
  const server = await startFakeModelServer(
    [
      { text: "noted" },
      { tool: { id: "toolu_fork", name: "Delegate", arguments: { task: "go on from here", fork: true } } },
      { text: "the fork's answer" },
      { text: "parent done" },
    ],
    { promptCache: cache },
  );
  const reports: ProviderUsageReport[] = [];
  const runner = createAgentTurnRunner({
    models: (name) =>
      name === "scripted"
        ? modelConfigFor(name)
        : { api: "anthropic-messages", modelId: "claude-fake-1", baseUrl: server.url, apiKey: "test-key" },
    onProviderUsage: (r) => reports.push(r),
  });
  const { service, repo } = makeService(db.pool, { runner });
  const account = await repo.createAccount({ name: `usage-${Date.now()}-${Math.random()}` });
  const parent = await service.createRootSession(account.id, MODEL);
  const first = await service.prompt(parent.id, account.id, "some earlier conversation");
  const second = await service.prompt(parent.id, account.id, "fork yourself and go on");
  await server.close();
  const result = messages(await repo.readJournal(parent.id, account.id)).find((m) => m.role === "toolResult");
  const forkId = result?.role === "toolResult" ? result.details?.childSessionId : undefined;
  if (!forkId) throw new Error("the fork's call returned no child");
  return { service, repo, account, parent, forkId, first, second, reports, requests: server.requests };
}

describe("provider usage with the journal, and fork-prefix diagnostics", () => {
  it("fork-prefix diagnostics page assistant rows until a usage-bearing response appears and tell whether the fork read its parent's prefix from the cache (S004-182)", async () => {
    const cache = new PromptCacheModel();
    const { service, repo, account, parent, forkId, first, second, reports } = await forkScenario(cache);

    // Every provider response's usage is kept beside its assistant row, never inside the row's JSON.
    const parentRows = await assistantRows(parent.id);
    expect(parentRows).toHaveLength(3);
    for (const row of parentRows) {
      expect(row.usage).not.toBeNull();
      expect(row.body).not.toMatch(/usage|cacheRead|cache_read/);
    }
    const forkRows = await assistantRows(forkId);
    const own = forkRows.filter((r) => r.usage !== null);
    expect(own).toHaveLength(1);
    // The fork's copied rows are its parent's context: byte-identical JSON, no usage of their own.
    const inherited = (await repo.getSession(forkId, account.id)).inheritedThrough ?? 0;
    expect(inherited).toBeGreaterThan(0);
    for (const row of forkRows.filter((r) => r.seq <= inherited)) {
      expect(row.usage).toBeNull();
      expect(row.body).toBe(parentRows.find((p) => p.seq === row.seq)?.body);
    }

    const diag = await service.forkPrefixDiagnostics(forkId, account.id);
    expect(diag).toMatchObject({
      sessionId: forkId,
      parentSessionId: parent.id,
      fork: true,
      inheritedThrough: inherited,
    });
    // The parent's response at the fork point is the request that asked for the fork (the Delegate call).
    const asked = parentRows.find((r) => r.body.includes("toolu_fork"));
    expect(diag.parentResponse?.seq).toBe(asked?.seq);
    expect(diag.parentResponse?.usage).toEqual(asked?.usage);
    expect(diag.response?.seq).toBe(own[0]?.seq);
    // The fork's first request repeated the parent's whole prompt: it read at least what the parent cached.
    expect(diag.parentCachedTokens).toBe((asked?.usage?.cacheRead ?? 0) + (asked?.usage?.cacheWrite ?? 0));
    expect(diag.response?.usage.cacheRead).toBeGreaterThanOrEqual(diag.parentCachedTokens ?? Infinity);
    expect(diag.prefixFromCache).toBe(true);
    expect(diag.response?.cacheReadRatio).toBeGreaterThan(0.5);

    // A session that is not a fork reports its newest response and no fork judgement.
    const root = await forkPrefixDiagnostics(repo, parent.id, account.id);
    expect(root).toMatchObject({ fork: false, parentResponse: null, prefixFromCache: null });
    expect(root.response?.seq).toBe(parentRows.at(-1)?.seq);

    // TurnOutcome.usage sums each turn's responses; the hook reported each response once, as journaled.
    expect(first.usage?.responses).toBe(1);
    expect(second.usage?.responses).toBe(2);
    const parentReports = reports.filter((r) => r.sessionId === parent.id);
    expect(parentReports.map((r) => r.usage)).toEqual(parentRows.map((r) => r.usage));
    expect(second.usage?.cacheRead).toBe(parentReports.slice(1).reduce((n, r) => n + r.usage.cacheRead, 0));
    expect(new Set(parentReports.slice(1).map((r) => r.turnId)).size).toBe(1);
    expect(parentReports[0]?.turnId).not.toBe(parentReports[1]?.turnId);
    expect(reports.filter((r) => r.sessionId === forkId)).toHaveLength(1);

    // Paging: 40 newer assistant rows without usage (more than a page of 32) do not hide the response.
    await repo.append(
      parent.id,
      account.id,
      Array.from({ length: 40 }, () => ({
        body: {
          type: "message" as const,
          message: {
            role: "assistant" as const,
            content: [{ type: "text" as const, text: "" }],
            stopReason: "stop" as const,
          },
        },
      })),
    );
    const paged = await newestUsageBearingResponse(repo, parent.id, account.id);
    expect(paged.response?.seq).toBe(parentRows.at(-1)?.seq);
    expect(paged.pages).toBe(2);
    expect(paged.rowsRead).toBe(41);
    // Nothing usage-bearing at all: every row is read, the answer is null.
    const none = await newestUsageBearingResponse(repo, parent.id, account.id, {
      beforeSeq: parentRows[0]?.seq,
    });
    expect(none).toEqual({ response: null, rowsRead: 0, pages: 1 });
  }, 60_000);

  it("a fork whose first request found nothing of its parent's prefix in the cache is reported as such (S004-182)", async () => {
    // The cache is evicted right before the fork's first request (the third request of the run).
    let n = 0;
    const cache = new (class extends PromptCacheModel {
      override usage(body: Record<string, unknown>) {
        if (++n === 3) this.clear();
        return super.usage(body);
      }
    })();
    const { service, account, forkId } = await forkScenario(cache);
    const diag = await service.forkPrefixDiagnostics(forkId, account.id);
    expect(diag.fork).toBe(true);
    expect(diag.response?.usage.cacheRead).toBe(0);
    expect(diag.parentCachedTokens).toBeGreaterThan(0);
    expect(diag.prefixFromCache).toBe(false);
  }, 60_000);

  it("the offline scripted provider reports no usage: no column, no hook call, no turn usage", async () => {
    const reports: ProviderUsageReport[] = [];
    const { service, repo } = makeService(db.pool, {
      runner: createAgentTurnRunner({ onProviderUsage: (r) => reports.push(r) }),
    });
    const account = await repo.createAccount({ name: `scripted-${Date.now()}` });
    const root = await service.createRootSession(account.id, "scripted");
    const outcome = await service.prompt(root.id, account.id, "hello");
    expect(outcome.stopReason).toBe("stop");
    expect(outcome.usage).toBeUndefined();
    expect(reports).toEqual([]);
    const rows = await assistantRows(root.id);
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.every((r) => r.usage === null)).toBe(true);
    expect((await service.forkPrefixDiagnostics(root.id, account.id)).response).toBeNull();
    expect(bearsUsage(null)).toBe(false);
  });
});
