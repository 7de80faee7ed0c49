import { randomUUID } from "node:crypto";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it, vi } from "vitest";
import { type JournalWrite, journalBodySchema, PgDelegationRepository } from "../src/index.js";

const db = useTestDatabase();

/** One of each kind of row a turn writes, with the members that round-trip least plainly. */
const writes: JournalWrite[] = [
  { body: { type: "message", message: { role: "user", content: "a \ud800 lone surrogate, 😀" } } },
  {
    body: {
      type: "message",
      message: {
        role: "assistant",
        content: [
          { type: "text", text: "calling" },
          {
            type: "toolCall",
            id: "c1",
            name: "Delegate",
            arguments: { task: "t", n: 1, nested: { "2": [null] } },
          },
        ],
        stopReason: "toolUse",
        providerContent: [
          { type: "thinking", thinking: "hm", thinkingSignature: "sig" },
          { type: "text", text: "calling" },
          {
            type: "toolCall",
            id: "c1",
            name: "Delegate",
            arguments: { task: "t", n: 1, nested: { "2": [null] } },
          },
        ],
      },
    },
  },
  { body: { type: "tool_intent", toolCallId: "c1", toolName: "Delegate", arguments: { task: "t" } } },
  {
    body: {
      type: "message",
      message: {
        role: "toolResult",
        toolCallId: "c1",
        toolName: "Delegate",
        content: "ok",
        isError: false,
        details: { resultId: randomUUID(), byteSize: 2 },
      },
    },
    settled: false,
  },
  { body: { type: "compaction", summary: "so far", firstKeptSeq: 1 } },
];

describe("an append answers the rows it wrote", () => {
  it("checks each body once, on the way in, and answers what a read decodes", async () => {
    const r = new PgDelegationRepository(db.pool);
    const account = await r.createAccount({ name: `ad-${randomUUID().slice(0, 8)}` });
    const session = await r.createRootSession(account.id, "scripted");
    const check = vi.spyOn(journalBodySchema, "safeParse");
    const appended = await r.append(session.id, account.id, writes);
    // Once per row, when the append shapes it; the rows the statement answers are not checked again.
    expect(check).toHaveBeenCalledTimes(writes.length);
    check.mockRestore();
    const read = await r.readJournal(session.id, account.id, { includeProvisional: true });
    expect(appended).toStrictEqual(read);
    expect(appended.map((e) => e.body)).toStrictEqual(writes.map((w) => w.body));
  });
});
