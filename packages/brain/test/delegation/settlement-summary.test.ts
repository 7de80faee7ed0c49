import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  type DelegationEvent,
  type DelegationServiceOptions,
  FileSpillStore,
  type OutputRecipient,
} from "../../src/index.js";
import { emitSummary, makeService, newParent, scratchDir } from "./helpers.js";

const db = useTestDatabase();

/** A service whose inline limit is 64 bytes, and a parent to prepare workflow wf-1's summaries for. */
async function summaries(overrides: Partial<DelegationServiceOptions> = {}) {
  const made = makeService(db.pool, { toolResultInlineBytes: () => 64, ...overrides });
  const { account, parent } = await newParent(made.service);
  const recipient = { sessionId: parent.id, principalAccountId: account.id };
  const prepare = (summary: string, outcome: "ok" | "error" = "ok") =>
    made.service.prepareWorkflowSummary(recipient, "wf-1", summary, outcome);
  return { ...made, parent, prepare };
}

const long = (what: string) => `workflow ${what}: ${"node ok; ".repeat(20)}`;

describe("a workflow summary prepared for its parent's inbox", () => {
  it("a summary within the inline limit stays inline, with the workflow's outcome", async () => {
    const { service, prepare } = await summaries();
    expect(await prepare("two nodes failed", "error")).toEqual({
      outcome: "error",
      body: "two nodes failed",
      byteSize: 16,
    });
    await service.close();
  });

  it("a longer summary is spilled whole under a name its content decides: the same summary, the same file", async () => {
    const { service, spillRoot, parent, prepare } = await summaries();
    const summary = long("finished");
    const first = await prepare(summary);
    const digest = createHash("sha256").update(summary).digest("hex").slice(0, 16);
    const path = join(spillRoot, parent.id, `workflow-wf-1-${digest}.txt`);
    expect(first.outcome).toBe("ok");
    expect(first.byteSize).toBe(Buffer.byteLength(summary));
    expect(first.spillId).toBeTruthy();
    expect(first.body.split("\n")[0]).toBe(
      `[full result: ${first.byteSize} bytes at ${path}; read that path with Read]`,
    );
    expect(readFileSync(path, "utf8")).toBe(summary);
    // a delivery retried after a crash prepares the same summary again: it writes the same file
    expect((await prepare(summary)).body).toBe(first.body);
    const other = await prepare(long("ended"));
    expect(other.body).not.toContain(path);
    await service.close();
  });

  it("a summary that could not be stored is an error result that says how the node outputs stay readable", async () => {
    const { service, prepare } = await summaries({
      spill: {
        write: async () => {
          throw new Error("disk full");
        },
      },
    });
    const summary = long("finished");
    const bytes = Buffer.byteLength(summary);
    expect(await prepare(summary)).toEqual({
      outcome: "error",
      body: `The work finished, but its ${bytes}-byte result could not be stored (disk full). The workflow's node outputs remain readable with DelegateRead on each node's child.`,
      byteSize: bytes,
      error: { code: "spill_failed", message: "disk full" },
    });
    await service.close();
  });
});

describe("a workflow summary emitted for its parent", () => {
  it("above the inline limit is spilled through the parent's own output writer", async () => {
    const captured: OutputRecipient[] = [];
    const writerRoot = scratchDir("crw-writer-");
    const { service, repo, parent } = await summaries({
      captureOutputWriter: async (recipient) => {
        captured.push(recipient);
        return new FileSpillStore(writerRoot);
      },
    });
    const summary = long("finished");
    const resultId = await emitSummary(service, parent.id, parent.principalAccountId, summary);
    await service.whenIdle();
    expect(captured).toEqual([{ sessionId: parent.id, principalAccountId: parent.principalAccountId }]);
    const path = (await repo.getResult(resultId, parent.principalAccountId)).spillPath ?? "";
    expect(path.startsWith(writerRoot)).toBe(true);
    expect(readFileSync(path, "utf8")).toBe(summary);
    await service.close();
  });

  it("emitted again (a retried delivery) wakes its parent only the first time", async () => {
    const events: DelegationEvent[] = [];
    const { service, parent } = await summaries({ onEvent: (e) => events.push(e) });
    const emit = () => emitSummary(service, parent.id, parent.principalAccountId, "all nodes ok");
    const first = await emit();
    await service.whenIdle();
    expect(await emit()).toBe(first);
    await service.whenIdle();
    expect(events.filter((e) => e.type === "delegation.result_steered")).toEqual([
      { type: "delegation.result_steered", parentSessionId: parent.id, resultId: first },
    ]);
    await service.close();
  });
});
