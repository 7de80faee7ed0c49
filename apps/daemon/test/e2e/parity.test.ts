import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { TurnRequest } from "@crw/brain";
import { useTestDatabase } from "@crw/tools/pg";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { loadConfig, ownerTokenPath, startDaemon } from "../../src/index.js";
import { steps, TestClient } from "../support/client.js";

/**
 * test:e2e:parity. The same scripted session runs through a daemon with its default forked runners and
 * through one with runners switched off (runtime.subagentRunnerEnabled=false). Every provider request is
 * captured where the daemon hands it to either placement (system prompt, tool catalog with schemas, the
 * context messages): each child turn's request must be identical in both modes, and equal to the stored
 * baseline. The transcripts the turns produced (in the runner, and in the daemon) must be identical too.
 *
 * The baseline (parity-baseline.json) changes only deliberately: run with CRW_PARITY_UPDATE=1 and
 * CRW_PARITY_REASON="<the source change and the exact delta it explains>"; the reason is stored with it.
 */
const db = useTestDatabase();
const baselinePath = resolve(import.meta.dirname, "parity-baseline.json");
const silent = pino({ level: "silent" });

/** Ids differ per run: each UUID becomes <id:N> by first appearance, so the shape and order remain. */
function normalize(value: unknown): unknown {
  const ids = new Map<string, string>();
  const text = JSON.stringify(value, (key, v) => (key === "timestamp" ? undefined : v));
  return JSON.parse(
    text.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, (m) => {
      if (!ids.has(m)) ids.set(m, `<id:${ids.size + 1}>`);
      return ids.get(m) as string;
    }),
  );
}

function fingerprint(request: TurnRequest) {
  const prefix = normalize({
    model: request.model,
    systemPrompt: request.systemPrompt,
    tools: request.tools.map((t) => ({ name: t.name, description: t.description, parameters: t.parameters })),
    context: request.context,
    readOnly: request.readOnly,
  });
  return {
    digest: createHash("sha256").update(JSON.stringify(prefix)).digest("hex"),
    prefix,
  };
}

const childTask = (n: number) => steps({ text: `child ${n} looked and reports: fine` });
const parentScript = steps(
  { toolCalls: [{ name: "Delegate", arguments: { task: childTask(1), background: false } }] },
  {
    toolCalls: [
      { name: "Delegate", arguments: { task: childTask(2), background: false, role: "reviewer" } },
      { name: "DelegateRead", arguments: { sessionId: "00000000-0000-4000-8000-000000000000" } },
    ],
  },
  { text: "both children answered" },
);

async function runSession(runnerEnabled: boolean) {
  const captured: { key: string; placement: string; digest: string; prefix: unknown }[] = [];
  const dataDir = mkdtempSync(join(tmpdir(), "crw-e2e-parity-"));
  const daemon = await startDaemon(
    loadConfig({
      env: { DATABASE_URL: db.url },
      overrides: { dataDir, port: 0, runtime: { subagentRunnerEnabled: runnerEnabled, maxRunners: 1 } },
    }),
    {
      log: silent,
      observeTurn: (request, placement) => {
        const first = request.context.find((m) => m.role === "user");
        const task = first && typeof first.content === "string" ? first.content : "";
        const kind = request.scope === null ? "root" : "child";
        captured.push({
          key: `${kind}:${task.slice(0, 80)}:${request.context.length}`,
          placement,
          ...fingerprint(request),
        });
      },
    },
  );
  const client = await TestClient.connect(
    daemon.state.url,
    readFileSync(ownerTokenPath(dataDir), "utf8").trim(),
  );
  try {
    const { sessionId } = await client.ok<{ sessionId: string }>("session.create");
    const reply = await client.ok<{ stopReason: string; reply: string }>("session.send", {
      sessionId,
      text: parentScript,
    });
    expect(reply).toMatchObject({ stopReason: "stop", reply: "both children answered" });
    const parent = await client.ok<{ messages: unknown[] }>("session.read", { sessionId, limit: 1000 });
    const children = (
      await db.pool.query("select id from sessions where parent_session_id = $1::uuid order by created_at", [
        sessionId,
      ])
    ).rows;
    const transcripts = [normalize(parent.messages)];
    for (const c of children)
      transcripts.push(
        normalize(
          (await client.ok<{ messages: unknown[] }>("session.read", { sessionId: c.id, limit: 1000 }))
            .messages,
        ),
      );
    return { captured, transcripts };
  } finally {
    client.close();
    await daemon.stop();
  }
}

describe("test:e2e:parity", () => {
  it("S004-446: S004-443: the same scripted session through the runner and in process gives the same provider request prefixes, checked against the stored baseline", async () => {
    const runner = await runSession(true);
    const local = await runSession(false);
    const children = (r: typeof runner) => r.captured.filter((c) => c.key.startsWith("child:"));

    // Runner use, unconditionally: with the default switch every child turn ran in a runner, and with the
    // switch off every one ran in the daemon; root sessions always run in the daemon.
    expect(children(runner).length).toBe(2);
    expect(children(runner).every((c) => c.placement === "runner")).toBe(true);
    expect(children(local).every((c) => c.placement === "in-process")).toBe(true);
    expect(
      runner.captured.filter((c) => c.key.startsWith("root:")).every((c) => c.placement === "in-process"),
    ).toBe(true);

    // The same requests in both modes, turn by turn, and the same transcripts.
    const digests = (r: typeof runner) => r.captured.map((c) => [c.key, c.digest]);
    expect(digests(runner)).toEqual(digests(local));
    expect(runner.transcripts).toEqual(local.transcripts);

    const current = { turns: Object.fromEntries(digests(runner)) };
    if (process.env.CRW_PARITY_UPDATE === "1") {
      const reason = process.env.CRW_PARITY_REASON;
      if (!reason)
        throw new Error("CRW_PARITY_UPDATE needs CRW_PARITY_REASON: the change and the delta it explains");
      writeFileSync(
        baselinePath,
        `${JSON.stringify({ reason, updatedAt: new Date().toISOString(), ...current, prefixes: runner.captured.map((c) => ({ key: c.key, prefix: c.prefix })) }, null, 2)}\n`,
      );
    }
    const baseline = JSON.parse(readFileSync(baselinePath, "utf8")) as {
      reason: string;
      turns: Record<string, string>;
    };
    expect(baseline.reason.length).toBeGreaterThan(0);
    expect(
      current.turns,
      "the provider request prefixes changed: update parity-baseline.json with the reason",
    ).toEqual(baseline.turns);
  }, 120_000);
});
