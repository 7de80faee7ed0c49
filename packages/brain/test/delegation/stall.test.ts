import { useTestDatabase } from "@crw/tools/pg";
import { beforeAll, describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  type DelegationEvent,
  type ProgressEvent,
  type SessionTurnRunner,
} from "../../src/index.js";
import {
  delegateCall,
  gateTool,
  latch,
  makeService,
  messages,
  newParent,
  resultIdsIn,
  scriptTask,
  waitFor,
} from "./helpers.js";

const db = useTestDatabase();

/** The stall bound of these tests; long enough that a child's quick steps never reach it on a busy machine. */
const STALL_MS = 1500;

/**
 * A foreground call whose child waits at a gate (no progress at all) longer than the stall bound: the
 * caller is let go, and the result comes through the parent's inbox once the gate opens.
 */
describe("a foreground call whose child stays silent", () => {
  let receipt: Awaited<ReturnType<ReturnType<typeof makeService>["service"]["delegate"]>>;
  let events: DelegationEvent[];
  let delivered: string[];
  let deliveredAfterIdle: string[];
  let silentFor: number;

  beforeAll(async () => {
    events = [];
    const gates = new Map<string, Promise<void>>();
    const gate = latch();
    gates.set("slow", gate.promise);
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      stallAfterMs: STALL_MS,
      onEvent: (e) => events.push(e),
    });
    const { account, parent } = await newParent(service);
    const t0 = Date.now();
    receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "quiet",
      task: scriptTask({ rounds: [[{ name: "Gate", arguments: { key: "slow" } }]], answer: "late answer" }),
      mode: "foreground",
    });
    silentFor = Date.now() - t0;
    gate.open();
    delivered = await waitFor(async () => {
      const ids = resultIdsIn(await repo.readJournal(parent.id, account.id));
      return ids.length > 0 ? ids : undefined;
    }, "the result in the parent's journal");
    await service.whenIdle();
    deliveredAfterIdle = resultIdsIn(await repo.readJournal(parent.id, account.id));
    await service.close();
  });

  it("is let go past the stall bound, as Ctrl+B lets it go: its Delegate answers started, with the silence it saw", () => {
    expect(receipt).toMatchObject({ kind: "started", stalledMs: expect.any(Number) });
    expect((receipt as { stalledMs: number }).stalledMs).toBeGreaterThanOrEqual(STALL_MS);
    expect(silentFor).toBeGreaterThanOrEqual(STALL_MS);
    const stalled = events.filter((e) => e.type === "delegation.stalled");
    expect(stalled).toEqual([expect.objectContaining({ moved: true })]);
    expect((stalled[0] as { silentMs: number }).silentMs).toBeGreaterThanOrEqual(STALL_MS);
  });

  it("its result arrives once, through the parent's inbox", () => {
    expect(delivered).toHaveLength(1);
    expect(deliveredAfterIdle).toEqual(delivered);
  });
});

describe("the Delegate tool of a foreground call its watchdog let go", () => {
  it("tells the delegating model the child showed no progress and goes on in the background", async () => {
    const gates = new Map<string, Promise<void>>();
    const gate = latch();
    gates.set("d", gate.promise);
    const { service, repo } = makeService(db.pool, {
      tools: () => [gateTool("Gate", gates)],
      stallAfterMs: STALL_MS,
    });
    const { account, parent } = await newParent(service);
    const receipt = await service.delegate({
      parentSessionId: parent.id,
      principalAccountId: account.id,
      toolCallId: "c",
      task: scriptTask({
        rounds: [[delegateCall({ rounds: [[{ name: "Gate", arguments: { key: "d" } }]], answer: "D late" })]],
        answer: "C goes on",
      }),
      mode: "background",
    });
    if (receipt.kind !== "started") throw new Error("expected a background call");
    const toolText = await waitFor(async () => {
      const result = messages(await repo.readJournal(receipt.childSessionId, account.id)).find(
        (m) => m.role === "toolResult",
      );
      return result?.role === "toolResult" ? JSON.stringify(result.content) : undefined;
    }, "C's Delegate answered");
    gate.open();
    await service.whenIdle();
    await service.close();
    expect(toolText).toMatch(/showed no progress for \d+ s, so it goes on in the background/);
  });
});

type Renewal = "text" | "tool" | "compaction" | "silent";

/**
 * A runner whose result turns (a turn whose input is a delivered result) report `kind` progress every
 * 250 ms for twice the stall bound before they answer (or, `silent`, report nothing meanwhile).
 */
function slowResultTurns(kind: Renewal): SessionTurnRunner {
  const scripted = createScriptedTurnRunner();
  return {
    async runTurn(request, host) {
      if (request.context.at(-1)?.role === "custom") {
        const until = Date.now() + 2 * STALL_MS;
        let n = 0;
        while (Date.now() < until) {
          await new Promise((ok) => setTimeout(ok, 250));
          const sessionId = request.sessionId;
          const event: ProgressEvent | null =
            kind === "text"
              ? { type: "text", sessionId, text: `still working ${n}` }
              : kind === "tool"
                ? { type: "tool", sessionId, toolName: "Read", toolCallId: `t${n}` }
                : kind === "compaction"
                  ? { type: "compaction", sessionId }
                  : null;
          if (event) host.progress(event);
          n++;
        }
      }
      return scripted.runTurn(request, host);
    },
  };
}

/**
 * A foreground call's child delegates a helper in the background and answers; the helper's result then
 * arrives while the call is open, and the child's result turn (a delivery turn) runs for twice the stall
 * bound, reporting one kind of progress as it goes, before it answers.
 */
async function callWithSlowDeliveryTurn(kind: Renewal) {
  const gates = new Map<string, Promise<void>>();
  const helperGate = latch();
  gates.set("helper", helperGate.promise);
  const events: DelegationEvent[] = [];
  const { service, repo } = makeService(db.pool, {
    tools: () => [gateTool("Gate", gates)],
    runner: slowResultTurns(kind),
    stallAfterMs: STALL_MS,
    onEvent: (e) => events.push(e),
  });
  const { account, parent } = await newParent(service);
  const progress: ProgressEvent[] = [];
  const call = service.delegate({
    parentSessionId: parent.id,
    principalAccountId: account.id,
    toolCallId: `c-${kind}`,
    task: scriptTask({
      rounds: [
        [
          delegateCall(
            { rounds: [[{ name: "Gate", arguments: { key: "helper" } }]], answer: "helper done" },
            { background: true },
          ),
        ],
      ],
      answer: "C done",
      followUp: "C got it",
    }),
    mode: "foreground",
    progress: (e) => progress.push(e),
  });
  await waitFor(async () => {
    const e = progress.find((x) => x.type === "session" && x.parentSessionId === parent.id);
    if (e?.type !== "session") return false;
    const last = messages(await repo.readJournal(e.sessionId, account.id)).at(-1);
    return last?.role === "assistant" && JSON.stringify(last.content).includes("C done");
  }, "the child's own answer journaled");
  helperGate.open();
  const receipt = await call;
  await service.whenIdle();
  await service.close();
  return { receipt, stalled: events.filter((e) => e.type === "delegation.stalled") };
}

describe("a foreground call whose child's delivery turn runs past the stall bound", () => {
  const outcomes = {} as Record<Renewal, Awaited<ReturnType<typeof callWithSlowDeliveryTurn>>>;
  beforeAll(async () => {
    const kinds: Renewal[] = ["text", "tool", "compaction", "silent"];
    const all = await Promise.all(kinds.map((k) => callWithSlowDeliveryTurn(k)));
    kinds.forEach((k, i) => {
      outcomes[k] = all[i] as (typeof all)[number];
    });
  }, 60_000);

  it("the delivery turn's text, tool and compaction events each renew the stall watchdog: the caller gets the result (S004-059)", () => {
    for (const kind of ["text", "tool", "compaction"] as const) {
      expect(outcomes[kind].receipt, kind).toMatchObject({ kind: "result", body: "C got it (1)" });
      expect(outcomes[kind].stalled, kind).toEqual([]);
    }
  });

  it("a delivery turn as long with no progress reaches the bound: the caller is let go", () => {
    expect(outcomes.silent.receipt).toMatchObject({ kind: "started" });
    expect(outcomes.silent.stalled).toEqual([expect.objectContaining({ moved: true })]);
  });
});
