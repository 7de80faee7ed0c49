import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import { createScriptedTurnRunner, type SessionTurnRunner } from "../../src/index.js";
import { continueForeground, makeService, newParent, queuedCall, recording, scriptTask } from "./helpers.js";

const db = useTestDatabase();

/** A service whose repository records, for `watched` sessions, each journal append and whether it stored a prompt. */
function observed(runner?: SessionTurnRunner) {
  const appends: string[] = [];
  const watched = new Set<string>();
  const rec = recording(runner);
  const made = makeService(db.pool, { runner: rec.runner });
  const plain = made.repo.append.bind(made.repo);
  made.repo.append = (sessionId, principal, entries, options) => {
    if (watched.has(sessionId)) appends.push("append");
    return plain(sessionId, principal, entries, options);
  };
  const withPrompt = made.repo.appendWithSystemPrompt.bind(made.repo);
  made.repo.appendWithSystemPrompt = (sessionId, principal, entries, prompt) => {
    if (watched.has(sessionId)) appends.push("append+prompt");
    return withPrompt(sessionId, principal, entries, prompt);
  };
  return { ...made, appends, watched, seen: rec.seen };
}

/** A queued call of a new parent, its child watched. */
async function watchedCall(made: ReturnType<typeof observed>, task: string) {
  const caller = await newParent(made.service);
  const run = await queuedCall(made.service, caller, "call", task);
  const child = run.childSessionId ?? "";
  made.watched.add(child);
  return { caller, run, child };
}

describe("a session's system prompt is stored by its first turn's first journal write", () => {
  it("the first row the child's turn writes stores the prompt that turn ran with; no statement of its own, none again", async () => {
    const made = observed();
    const { caller, run, child } = await watchedCall(
      made,
      scriptTask({ rounds: [[{ name: "Read", arguments: { path: "/nowhere" } }]], answer: "done" }),
    );
    expect((await made.repo.getSession(child, caller.account.id)).systemPrompt).toBeNull();
    await made.service.executeRun(run);
    // the assistant message that calls the tool, the intent, the tool result, the answer
    expect(made.appends[0]).toBe("append+prompt");
    expect(made.appends.slice(1).every((a) => a === "append")).toBe(true);
    expect(made.appends.length).toBeGreaterThan(1);
    const ran = made.seen.filter((r) => r.sessionId === child);
    expect(ran).toHaveLength(1);
    const stored = (await made.repo.getSession(child, caller.account.id)).systemPrompt;
    expect(stored).toBe(ran[0]?.systemPrompt);
    await made.service.close();
  });

  it("a later turn of the same session runs with the stored prompt and stores none", async () => {
    const made = observed();
    const { caller, run, child } = await watchedCall(made, scriptTask({ answer: "done", followUp: "more" }));
    await made.service.executeRun(run);
    const before = made.appends.length;
    // a foreground continuation: its turn runs on the child's stored prompt
    const receipt = await continueForeground(made.service, caller, child, "again", "go on");
    expect(receipt.kind).toBe("result");
    expect(made.appends.slice(before)).not.toContain("append+prompt");
    const ran = made.seen.filter((r) => r.sessionId === child);
    expect(ran.length).toBeGreaterThanOrEqual(2);
    expect(new Set(ran.map((r) => r.systemPrompt)).size).toBe(1);
    await made.service.close();
  });

  it("a turn that writes no row stores no prompt: the next turn composes it again from the same rows", async () => {
    const scripted = createScriptedTurnRunner();
    const fail = true;
    const failing: SessionTurnRunner = {
      runTurn(request, host) {
        if (fail && made.watched.has(request.sessionId)) throw new Error("the provider is down");
        return scripted.runTurn(request, host);
      },
    };
    const made = observed(failing);
    const { caller, run, child } = await watchedCall(made, scriptTask({ answer: "done" }));
    await made.service.executeRun(run);
    expect(made.appends).toEqual([]);
    expect((await made.repo.getSession(child, caller.account.id)).systemPrompt).toBeNull();
    await made.service.close();
  });
});
