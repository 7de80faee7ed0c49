import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TranscriptMessage } from "@crw/db";
import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, type SessionTurnRunner, type TurnRequest } from "../../src/index.js";
import {
  delegateBackground,
  delegateCall,
  delegateForeground,
  latch,
  makeService,
  messages,
  newParent,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/**
 * A root parent's model at the edge: when a spilled result arrives it reads the placeholder's path with the
 * Read tool it was given (page by page, through the same scoped tool wrapper every runner gets) and answers
 * with what it read; every other turn is the scripted runner's.
 */
function readingRunner(extraReads: string[] = []) {
  const scripted = createScriptedTurnRunner();
  const seen = { toolNames: [] as string[][], read: "", refusals: [] as string[] };
  const runner: SessionTurnRunner = {
    async runTurn(request: TurnRequest, host) {
      const last = request.context.at(-1) as TranscriptMessage | undefined;
      const spillPath = last?.role === "custom" ? last.details?.spillPath : undefined;
      if (!spillPath) return scripted.runTurn(request, host);
      seen.toolNames.push(request.tools.map((t) => t.name));
      const read = request.tools.find((t) => t.name === "Read");
      if (!read) throw new Error("no Read tool");
      const ctx = {
        sessionId: request.sessionId,
        principalAccountId: request.principalAccountId,
        toolCallId: "read-1",
        readOnly: request.readOnly,
        workDir: request.workDir,
        signal: request.signal,
        progress: () => {},
      };
      for (const path of extraReads) {
        await read.execute({ path }, ctx).then(
          () => seen.refusals.push(`read ${path}`),
          (e: Error & { code?: string }) => seen.refusals.push(e.code ?? e.message),
        );
      }
      let offset = 0;
      for (let page = 0; page < 100; page++) {
        const out = await read.execute({ path: spillPath, offset, limit: 1000 }, ctx);
        const more = /\n\[bytes \d+-(\d+) of \d+; read on with offset (\d+)\]$/.exec(out.content);
        if (!more) {
          seen.read += out.content;
          break;
        }
        seen.read += out.content.slice(0, more.index);
        offset = Number(more[2]);
      }
      await host.record({
        role: "assistant",
        content: [{ type: "text", text: `read ${Buffer.byteLength(seen.read)} bytes` }],
        stopReason: "stop",
      });
      return { stopReason: "stop" };
    },
  };
  return { runner, seen };
}

describe("Read for spilled results", () => {
  it("a root parent reads its spilled result's path with Read in its own namespace, page by page (S004-240)", async () => {
    const r = readingRunner();
    const { service, repo } = makeService(db.pool, { runner: r.runner, toolResultInlineBytes: () => 100 });
    const { account, parent } = await newParent(service);
    const body = `start ${"ünïcödé ".repeat(400)} end`;
    await delegateBackground(service, { parent, account }, "bg", scriptTask({ answer: body }));
    await waitFor(async () => r.seen.read.length > 0, "the parent to read its spilled result");
    await service.whenIdle();
    expect(r.seen.toolNames[0]).toContain("Read");
    // Every byte, across page boundaries that never split a character.
    expect(r.seen.read).toBe(body);
    const answer = messages(await repo.readJournal(parent.id, account.id)).at(-1);
    expect(answer).toMatchObject({
      role: "assistant",
      content: [{ text: `read ${Buffer.byteLength(body)} bytes` }],
    });
    await service.close();
  });

  it("a delegated child reads its helper's spilled result with Read in its own namespace (S004-240)", async () => {
    const r = readingRunner();
    const body = `helper ${"ünïcödé ".repeat(40)} end`;
    // The helper answers only once the child's first turn is over: its result then reaches the child in a
    // result turn of its own (read there), never in the first turn's steering drain, however fast it is.
    const childTurnOver = latch();
    const has = (request: TurnRequest, text: string) =>
      request.context.some((m) => m.role === "user" && JSON.stringify(m.content).includes(text));
    const runner: SessionTurnRunner = {
      async runTurn(request, host) {
        if (has(request, "helper ") && !has(request, "C done")) await childTurnOver.promise;
        const outcome = await r.runner.runTurn(request, host);
        if (has(request, "C done")) childTurnOver.open();
        return outcome;
      },
    };
    const { service, repo } = makeService(db.pool, { runner, toolResultInlineBytes: () => 100 });
    const caller = await newParent(service);
    const receipt = await delegateForeground(
      service,
      caller,
      "c",
      scriptTask({ rounds: [[delegateCall({ answer: body }, { background: true })]], answer: "C done" }),
    );
    if (receipt.kind !== "result") throw new Error("expected the call's result");
    await service.whenIdle();
    // The helper's result reached the child spilled; the child's own Read gave back every byte.
    expect(r.seen.read).toBe(body);
    expect(receipt.body).toBe(`read ${Buffer.byteLength(body)} bytes`);
    const spilled = await repo.settledResultIds(receipt.childSessionId, caller.account.id);
    expect(spilled).toHaveLength(1);
    await service.close();
  });

  it("Read reaches nothing but the session's own spilled results (S004-240)", async () => {
    const first = makeService(db.pool, { toolResultInlineBytes: () => 10 });
    const other = await newParent(first.service);
    const receipt = await first.service.delegate({
      parentSessionId: other.parent.id,
      principalAccountId: other.account.id,
      toolCallId: "other",
      task: scriptTask({ answer: "another session's spilled output" }),
      mode: "foreground",
    });
    if (receipt.kind !== "result") throw new Error("expected the call's result");
    // The result row, queued or already delivered to its idle parent: the spill path stays on it either way.
    const foreign = await first.repo.resultForRun(receipt.runId, other.account.id);
    const foreignPath = foreign?.spillPath ?? "";
    expect(foreignPath).not.toBe("");
    await first.service.close();

    const loose = join(first.spillRoot, "loose.txt");
    writeFileSync(loose, "not a recorded spill");
    const r = readingRunner([foreignPath, loose, "/etc/hostname"]);
    const { service } = makeService(db.pool, { runner: r.runner, toolResultInlineBytes: () => 10 });
    const { account, parent } = await newParent(service);
    await delegateBackground(
      service,
      { parent, account },
      "bg",
      scriptTask({ answer: "this session's own spilled output" }),
    );
    await waitFor(async () => r.seen.read.length > 0, "the parent's read");
    await service.whenIdle();
    expect(r.seen.refusals).toEqual(["not_found", "not_found", "not_found"]);
    expect(r.seen.read).toBe("this session's own spilled output");
    await service.close();
  });
});
