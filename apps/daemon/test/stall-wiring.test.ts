import { useTestDatabase } from "@crw/tools/pg";
import { scratchDir } from "@crw/tools/scratch";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/index.js";
import type { TestClient } from "./support/client.js";
import { startTestDaemon } from "./support/daemon.js";
import { gate, type LoopbackProvider, lastUserText, startLoopbackProvider } from "./support/provider.js";
import { waitFor } from "./support/wait.js";

/**
 * daemon.json's stallAfterMs reaches the delegation core: a foreground delegation whose child's model
 * request gets no answer (nothing streams, no progress) is moved to the background once the bound passes,
 * and its result reaches the parent later, once. One daemon with forked runners, a real PostgreSQL and a
 * model provider on loopback (OpenAI Chat Completions over SSE).
 */
const db = useTestDatabase();
const KEY_VAR = "CRW_TEST_STALL_KEY";
const MODEL = "openai-completions:loopback-stall";
const STALL_MS = 1500;
const held = gate();
let provider: LoopbackProvider;
let daemon: Daemon;
let owner: TestClient;

beforeAll(async () => {
  provider = await startLoopbackProvider(async (request) => {
    const text = lastUserText(request);
    if (text.includes("SILENT-CHILD")) await held.wait;
    return { text: `answered: ${text.slice(-40)}` };
  });
  const dataDir = scratchDir("crw-daemon-stall-");
  ({ daemon, owner } = await startTestDaemon({
    databaseUrl: db.url,
    dataDir,
    baseUrls: { "openai-completions": provider.baseUrl },
    keyVar: KEY_VAR,
    overrides: { stallAfterMs: STALL_MS },
  }));
});

afterAll(async () => {
  held.open();
  owner?.close();
  await daemon?.stop();
  await provider?.close();
});

describe("a foreground delegation through the daemon whose child stays silent", () => {
  it("is moved to the background once daemon.json's stall bound passes, and its result reaches the parent once", async () => {
    const { sessionId } = await owner.ok<{ sessionId: string }>("session.create");
    const t0 = Date.now();
    const receipt = await owner.ok<{ kind: string; runId: string; stalledMs?: number }>("session.delegate", {
      sessionId,
      task: "SILENT-CHILD work",
      model: MODEL,
    });
    expect(receipt.kind).toBe("started");
    expect(receipt.stalledMs).toBeGreaterThanOrEqual(STALL_MS);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(STALL_MS);
    held.open();
    const who = await owner.ok<{ accountId: string }>("daemon.whoami");
    const settled = () => daemon.runtime.repo.settledResultIds(sessionId, who.accountId);
    await waitFor(
      async () => (await settled()).length > 0,
      "the child's result settled for the parent",
      20_000,
    );
    await daemon.runtime.service.whenIdle();
    expect(await settled()).toHaveLength(1);
    const run = await daemon.runtime.repo.getRun(receipt.runId, who.accountId);
    expect(run.mode).toBe("background");
  });
});
