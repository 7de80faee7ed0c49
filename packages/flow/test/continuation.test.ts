import { readFileSync } from "node:fs";
import { conversationOf, FlowCallError, type JournalRow, shadowReplay, type Workflow } from "@crw/flow";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  defineWorkflow,
  type InProcessRun,
  inProcessRun,
  countSchema as schema,
  until,
} from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const of = <T extends JournalRow["type"]>(rows: JournalRow[], type: T) =>
  rows.filter((r): r is Extract<JournalRow, { type: T }> => r.type === type);

async function answerNext(
  r: InProcessRun,
  call: string,
  answer: string,
  pair?: { model: string; effort: string },
) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const step = (await r.steps(1)).find((s) => s.call === call);
    if (step) {
      const a = r.fake.spawnSubagent({
        ownerThreadId: r.owner,
        message: step.message,
        agentRole: step.agent_type,
        ...(pair ? { model: pair.model, reasoningEffort: pair.effort } : {}),
      });
      expect(await r.report(step, a.threadId)).toBe("bound");
      r.fake.answer(a.threadId, answer);
      return { step, agent: a.threadId };
    }
    if (Date.now() > deadline) throw new Error(`no step of ${call}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

async function stepOf(r: InProcessRun, call: string) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const step = (await r.steps(1)).find((s) => s.call === call);
    if (step) return step;
    if (Date.now() > deadline) throw new Error(`no step of ${call}`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

describe("continuations (resume: handle)", () => {
  describe("a call continued twice: explorer.2 continues explorer.1, explorer.3 continues explorer.2", () => {
    let r: InProcessRun;
    let wf: Workflow;
    const agents: Record<string, { agent: string; packet: string }> = {};
    let result: unknown;
    let rows: JournalRow[];
    const turnRecord = (call: string, place: number, marker: string, input: string) =>
      `Call ${call}, conversation turn ${place} (${marker}), its input:\n\n\`\`\`text\n${input}\n\`\`\``;

    beforeAll(async () => {
      // the role leaves the effort to the host: explorer.3 asks an explicit one, compared with the pair the
      // newest subagent of its handle ran
      r = await inProcessRun({ roles: { explorer: { model: "m-x" } } });
      wf = defineWorkflow({
        name: "cont",
        run: async (ctx) => {
          const first = await ctx.call<{ n: number }>({ role: "explorer", task: "count the files", schema });
          const second = await ctx.call<{ n: number }>({
            role: "explorer",
            task: "now count them again",
            schema,
            resume: "explorer.1",
          });
          const third = await ctx.call<{ n: number }>({
            role: "explorer",
            task: "and once more",
            schema,
            resume: "explorer.2",
            effort: "high",
          });
          return [first.n, second.n, third.n];
        },
      });
      const { done } = r.background(wf);
      for (const [call, effort, n] of [
        ["explorer.1", "low", 4],
        ["explorer.2", "high", 5],
        ["explorer.3", "high", 6],
      ] as const) {
        const step = await stepOf(r, call);
        const a = r.spawn(step, "explorer", { model: "m-x", reasoningEffort: effort }).threadId;
        expect(await r.report(step, a)).toBe("bound");
        r.fake.answer(a, `{"n":${n}}`);
        agents[call] = { agent: a, packet: step.packet };
      }
      result = await done;
      rows = r.rows();
    }, 60_000);

    afterAll(async () => {
      await r?.close();
    });

    it("each continuation runs on a new subagent with a thread_started of its own, which the next handle chain and pair name (S000-155 S000-026)", () => {
      expect(result).toEqual({ state: "completed", result: [4, 5, 6] });
      const a = agents["explorer.1"]?.agent;
      const b = agents["explorer.2"]?.agent;
      const c = agents["explorer.3"]?.agent;
      expect(new Set([a, b, c]).size).toBe(3);
      // each continuation's turn was asked of a subagent to spawn, never sent to its handle's subagent
      expect(of(rows, "step_published").map((s) => [s.call, s.action, s.agent_id])).toEqual([
        ["explorer.1", "spawn", undefined],
        ["explorer.2", "spawn", undefined],
        ["explorer.3", "spawn", undefined],
      ]);
      expect(of(rows, "thread_started").map((t) => [t.call, t.thread_id])).toEqual([
        ["explorer.1", a],
        ["explorer.2", b],
        ["explorer.3", c],
      ]);
      // explorer.3 asked effort high: explorer.2's subagent ran high, explorer.1's low; it was not refused
      expect(of(rows, "prepared").find((p) => p.call === "explorer.3")?.input.resume).toEqual({
        call: "explorer.2",
        chain: [a, b],
      });
    });

    it("a continuation's packet names the continued call's packet and a file holding its answer (S000-051)", () => {
      const packet = readFileSync(agents["explorer.2"]?.packet as string, "utf8");
      expect(packet).toContain("## Continued call explorer.1");
      expect(packet).toContain(`- Its packet: ${agents["explorer.1"]?.packet}`);
      const answerFile = /Its answer: (\S+)/.exec(packet)?.[1] ?? "";
      expect(JSON.parse(readFileSync(answerFile, "utf8"))).toEqual({ n: 4 });
    });

    it("a continuation's packet carries the record of the handle's turns, each with the input it took (S000-157)", () => {
      const second = readFileSync(agents["explorer.2"]?.packet as string, "utf8");
      expect(second).toContain(turnRecord("explorer.1", 1, "explorer.1/t1-a1", "count the files"));
      const third = readFileSync(agents["explorer.3"]?.packet as string, "utf8");
      expect(third).toContain(turnRecord("explorer.1", 1, "explorer.1/t1-a1", "count the files"));
      expect(third).toContain(turnRecord("explorer.2", 1, "explorer.2/t1-a1", "now count them again"));
    });

    it("the record holds the turns of the calls the handle continued before the handle's own: explorer.1's, then explorer.2's (S000-158)", () => {
      const third = readFileSync(agents["explorer.3"]?.packet as string, "utf8");
      const one = third.indexOf("Call explorer.1, conversation turn 1 (explorer.1/t1-a1)");
      const two = third.indexOf("Call explorer.2, conversation turn 1 (explorer.2/t1-a1)");
      expect(one).toBeGreaterThan(0);
      expect(two).toBeGreaterThan(one);
    });

    it("the continuation's input digest keeps the handle's thread chain: the run replays, a chain changed before it diverges (S000-165)", async () => {
      expect(of(rows, "prepared").find((p) => p.call === "explorer.2")?.input.resume).toEqual({
        call: "explorer.1",
        chain: [agents["explorer.1"]?.agent],
      });
      expect(await shadowReplay(r.spec.run_id, wf, null, rows)).toMatchObject({
        replay: "completed",
        divergences: [],
      });
      // explorer.1 bound to another subagent: the positions after it no longer replay
      const other = rows.map((x) =>
        x.type === "thread_started" && x.call === "explorer.1" ? { ...x, thread_id: "thread-other" } : x,
      );
      const replay = await shadowReplay(r.spec.run_id, wf, null, other);
      expect(replay.divergences.length).toBeGreaterThan(0);
    });
  });

  /**
   * explorer.1 runs on a subagent of model m-x with effort low; reviewer.1 continues it, on a subagent of
   * m-x with effort medium when `runs`. Answers the continuation's refusal (null when none) and the calls
   * prepared.
   */
  async function continueAsReviewer(r: InProcessRun, runs: boolean) {
    let refused: unknown = null;
    const wf = defineWorkflow({
      name: "continued",
      run: async (ctx) => {
        await ctx.call({ role: "explorer", task: "look", schema });
        try {
          await ctx.call({ role: "reviewer", task: "review what you saw", schema, resume: "explorer.1" });
        } catch (e) {
          refused = e;
        }
        return "done";
      },
    });
    const { done } = r.background(wf);
    await answerNext(r, "explorer.1", '{"n":1}', { model: "m-x", effort: "low" });
    if (runs) await answerNext(r, "reviewer.1", '{"n":2}', { model: "m-x", effort: "medium" });
    else
      await until(
        "the continuation refused or prepared",
        () => refused !== null || r.rows().some((x) => x.type === "prepared" && x.call === "reviewer.1"),
      );
    return { refused, prepared: of(r.rows(), "prepared").map((p) => p.call), done };
  }

  it.each([
    ["model", { model: "m-review" }, "ran model m-x, role reviewer decides m-review"],
    ["effort", { model: "m-x", effort: "high" }, "ran effort low, role reviewer decides high"],
  ])(
    "a continuation whose role decides another %s than the handle's subagent ran is refused pair_refused (S000-072)",
    async (_part, reviewer, says) => {
      run = await inProcessRun({ roles: { explorer: { model: "m-x" }, reviewer } });
      const { refused, prepared, done } = await continueAsReviewer(run, false);
      expect(refused).toBeInstanceOf(FlowCallError);
      expect(String((refused as Error).message)).toContain(`pair_refused: explorer.1's subagent ${says}`);
      expect(prepared).toEqual(["explorer.1"]);
      expect(await done).toMatchObject({ state: "completed" });
    },
  );

  it.each([
    ["the model alone", { model: "m-x" }],
    ["nothing", null],
  ])(
    "only what the role decides is compared: a role that decides %s continues a handle whose subagent ran another effort (S000-070)",
    async (_decides, reviewer) => {
      run = await inProcessRun({ roles: { explorer: { model: "m-x" }, ...(reviewer ? { reviewer } : {}) } });
      const { refused, prepared, done } = await continueAsReviewer(run, true);
      expect(await done).toMatchObject({ state: "completed" });
      expect(refused).toBeNull();
      expect(prepared).toEqual(["explorer.1", "reviewer.1"]);
    },
  );
});

describe("an explicit effort on a continuation", () => {
  it("with the role's effort undecided, an explicit effort is compared with the effort the handle's subagent ran: the same one runs (the step asks it, the bind checks it), another is pair_refused (S000-073)", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-x" } } });
    const r = run;
    let refused: unknown = null;
    const wf = defineWorkflow({
      name: "explicit",
      run: async (ctx) => {
        await ctx.call({ role: "explorer", task: "look", schema });
        try {
          await ctx.call({
            role: "explorer",
            task: "look deeper",
            schema,
            resume: "explorer.1",
            effort: "low",
          });
        } catch (e) {
          refused = e;
        }
        return ctx.call({
          role: "explorer",
          task: "look again",
          schema,
          resume: "explorer.1",
          effort: "high",
        });
      },
    });
    const { done } = r.background(wf);
    const stepOf = async (call: string) => {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const step = (await r.steps(1)).find((s) => s.call === call);
        if (step) return step;
        if (Date.now() > deadline) throw new Error(`no step of ${call}`);
        await new Promise((res) => setTimeout(res, 20));
      }
    };
    const spawn = (step: { message: string }, effort: string) =>
      r.spawn(step, "explorer", { model: "m-x", reasoningEffort: effort }).threadId;
    const s1 = await stepOf("explorer.1");
    expect(s1.reasoning_effort).toBeNull(); // the role leaves it to the host
    const a1 = spawn(s1, "high");
    expect(await r.report(s1, a1)).toBe("bound");
    r.fake.answer(a1, '{"n":1}');
    // explorer.2 asks low: its handle's subagent ran high
    const s3 = await stepOf("explorer.3");
    expect(refused).toBeInstanceOf(FlowCallError);
    expect((refused as FlowCallError).reason).toMatch(
      /^pair_refused: explorer\.1's subagent ran effort high/,
    );
    expect(of(r.rows(), "prepared").map((p) => p.call)).toEqual(["explorer.1", "explorer.3"]);
    // explorer.3 asks high: its step names the effort and a subagent on another effort is not bound
    expect(s3.reasoning_effort).toBe("high");
    expect(of(r.rows(), "prepared")[1]?.input).toMatchObject({ effort: "high" });
    const wrong = spawn(s3, "medium");
    expect(await r.report(s3, wrong)).toBe("pair_mismatch");
    const right = spawn(s3, "high");
    expect(await r.report(s3, right)).toBe("bound");
    r.fake.answer(right, '{"n":3}');
    expect(await done).toEqual({ state: "completed", result: { n: 3 } });
    const t3 = of(r.rows(), "thread_started").find((t) => t.call === "explorer.3");
    expect(t3).toMatchObject({ thread_id: right, effort: "high" });
    expect(t3?.effort_unchecked).toBeUndefined();
  });

  it("an explicit effort is a continuation's option; one that differs from an effort the role decides is pair_refused", async () => {
    run = await inProcessRun({ roles: { explorer: { model: "m-x", effort: "high" } } });
    const r = run;
    const errors: unknown[] = [];
    const wf = defineWorkflow({
      name: "explicit-bad",
      run: async (ctx) => {
        try {
          await ctx.call({ role: "explorer", task: "look", schema, effort: "low" });
        } catch (e) {
          errors.push(e);
        }
        await ctx.call({ role: "explorer", task: "look", schema });
        try {
          await ctx.call({
            role: "explorer",
            task: "look again",
            schema,
            resume: "explorer.1",
            effort: "low",
          });
        } catch (e) {
          errors.push(e);
        }
        return "done";
      },
    });
    const { done } = r.background(wf);
    await answerNext(r, "explorer.1", '{"n":1}', { model: "m-x", effort: "high" });
    expect(await done).toMatchObject({ state: "completed" });
    expect(String((errors[0] as Error).message)).toMatch(/effort is a continuation's option/);
    expect(errors[1]).toBeInstanceOf(FlowCallError);
    expect((errors[1] as FlowCallError).reason).toBe(
      "pair_refused: role explorer decides effort high, not low",
    );
  });
});

describe("continuing a call bound pair_unchecked or effort_unchecked", () => {
  const cases = [
    {
      unchecked: "effort_unchecked",
      roles: { explorer: { model: "m-x" } },
      pairs: [
        ["m-x", "low"],
        ["m-x", "medium"],
      ],
    },
    {
      unchecked: "pair_unchecked",
      roles: undefined,
      pairs: [
        ["m-x", "low"],
        ["m-y", "medium"],
      ],
    },
  ] as const;
  it.each(cases)(
    "a handle bound $unchecked continues on a new subagent whose bind records the pair it runs (S000-071)",
    async ({ unchecked, roles, pairs }) => {
      run = await inProcessRun(roles ? { roles } : {});
      const r = run;
      const wf = defineWorkflow({
        name: "unchecked",
        run: async (ctx) => {
          await ctx.call({ role: "explorer", task: "look", schema });
          return ctx.call({ role: "explorer", task: "look again", schema, resume: "explorer.1" });
        },
      });
      const { done } = r.background(wf);
      const spawnWith = async (call: string, [model, effort]: readonly [string, string]) => {
        const deadline = Date.now() + 10_000;
        for (;;) {
          const step = (await r.steps(1)).find((s) => s.call === call);
          if (step) {
            const a = r.spawn(step, "explorer", { model, reasoningEffort: effort });
            expect(await r.report(step, a.threadId)).toBe("bound");
            r.fake.answer(a.threadId, '{"n":1}');
            return a.threadId;
          }
          if (Date.now() > deadline) throw new Error(`no step of ${call}`);
          await new Promise((res) => setTimeout(res, 20));
        }
      };
      const first = await spawnWith("explorer.1", pairs[0]);
      const second = await spawnWith("explorer.2", pairs[1]);
      expect(await done).toMatchObject({ state: "completed" });
      expect(second).not.toBe(first);
      const threads = of(r.rows(), "thread_started");
      expect(threads.map((t) => [t.call, t.thread_id, t.model, t.effort, t[unchecked]])).toEqual([
        ["explorer.1", first, ...pairs[0], true],
        ["explorer.2", second, ...pairs[1], true],
      ]);
    },
  );
});

describe("the conversation list", () => {
  const base = { seq: 0, at: "t" };
  const step = (k: number, attempt: number, input: string, repair = false) =>
    ({
      ...base,
      type: "step_published",
      call: "c.1",
      op: `c.1/t${k}`,
      k,
      marker: `c.1/t${k}-a${attempt}`,
      attempt,
      input,
      ...(repair ? { repair: { answer: "x", errors: ["e"] } } : {}),
    }) as unknown as JournalRow;
  const turn = (k: number, attempt: number, id: string, place?: number) =>
    ({
      ...base,
      type: "turn_started",
      call: "c.1",
      op: `c.1/t${k}`,
      k,
      turn_id: id,
      attempt,
      marker: `c.1/t${k}-a${attempt}`,
      ...(place ? { conversation_turn: place } : {}),
    }) as unknown as JournalRow;

  const list = (rows: JournalRow[]) => conversationOf("c.1", rows).map((t) => [t.place, t.turn_id, t.input]);

  it("each turn sits at the conversation_turn its turn_started records, each place once, the newest turn at it (S000-159)", () => {
    const rows = [
      step(1, 1, "task"),
      turn(1, 1, "t-a", 1),
      step(2, 1, "repair", true),
      turn(2, 1, "t-b", 2),
      step(3, 2, "repair again", true),
      turn(3, 2, "t-c", 2), // recorded place 2 again: the newest there
      step(4, 2, "late", true),
      turn(4, 2, "t-d", 1), // a recorded place wins over what its step would say (a repair: place 2)
    ];
    expect(list(rows)).toEqual([
      [1, "t-d", "late"],
      [2, "t-c", "repair again"],
    ]);
  });

  it("a legacy turn_started without conversation_turn takes its place from the step at its k: a task turn 1, a repair 2 (S000-163)", () => {
    expect(
      list([step(1, 1, "task"), turn(1, 1, "t-a"), step(2, 1, "repair", true), turn(2, 1, "t-b")]),
    ).toEqual([
      [1, "t-a", "task"],
      [2, "t-b", "repair"],
    ]);
    // the repair member alone decides: a later k that is no repair is a task turn
    expect(list([step(3, 1, "task at k 3"), turn(3, 1, "t-c")])).toEqual([[1, "t-c", "task at k 3"]]);
  });

  it("a later legacy turn at the same place replaces the earlier one (S000-164)", () => {
    expect(list([step(1, 1, "task"), turn(1, 1, "t-a"), step(1, 2, "task"), turn(1, 2, "t-b")])).toEqual([
      [1, "t-b", "task"],
    ]);
    expect(
      list([
        step(2, 1, "repair", true),
        turn(2, 1, "t-c"),
        step(3, 2, "repair", true),
        turn(3, 2, "t-d"),
        step(4, 3, "task"),
        turn(4, 3, "t-e"),
      ]),
    ).toEqual([
      [1, "t-e", "task"],
      [2, "t-d", "repair"],
    ]);
  });
});

describe("turns run again", () => {
  it("a held call's repair on a new subagent at the next k, and a lost turn's next attempt, record the replaced place and replaces_turn; the conversation (and a continuation's record) takes the newest (S000-160 S000-161)", async () => {
    run = await inProcessRun({ lostAfterMs: 200 });
    const r = run;
    const wf = defineWorkflow({
      name: "again",
      run: async (ctx) => {
        const first = await ctx.call<{ n: number }>({ role: "explorer", task: "count the files", schema });
        const next = await ctx.call<{ n: number }>({
          role: "explorer",
          task: "count them again",
          schema,
          resume: "explorer.1",
        });
        return [first.n, next.n];
      },
    });
    const stepOf = async (match: (s: { call: string; k: number; attempt: number }) => boolean) => {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const step = (await r.steps(1)).find(match);
        if (step) return step;
        if (Date.now() > deadline) throw new Error("no such step");
        await new Promise((res) => setTimeout(res, 20));
      }
    };
    const spawn = (message: string) =>
      r.fake.spawnSubagent({ ownerThreadId: r.owner, message, agentRole: "explorer" }).threadId;
    // first process: the task turn answers prose, the repair goes to the same subagent and its turn fails
    const p1 = r.background(wf);
    const s1 = await stepOf((s) => s.call === "explorer.1" && s.k === 1);
    const a = spawn(s1.message);
    expect(await r.report(s1, a)).toBe("bound");
    r.fake.answer(a, "about seven");
    const s2 = await stepOf((s) => s.call === "explorer.1" && s.k === 2);
    expect(s2).toMatchObject({ action: "send_input", agent_id: a });
    r.fake.sendInput(a, s2.message);
    expect(await r.report(s2, a)).toBe("bound");
    r.fake.failTurn(a, "internalServerError", { message: "boom" });
    expect(await p1.done).toEqual({ state: "paused", reason: "held:explorer.1" });
    // the resume: the held repair goes on in place on a new subagent at the next k
    const p2 = r.background(wf);
    const s3 = await stepOf((s) => s.call === "explorer.1" && s.k === 3 && s.attempt === 2);
    expect(s3.action).toBe("spawn");
    const b = spawn(s3.message);
    expect(await r.report(s3, b)).toBe("bound");
    r.fake.setThreadStatus(b, "notLoaded"); // its turn never ends: lost after LostAfter
    const s4 = await stepOf((s) => s.call === "explorer.1" && s.k === 3 && s.attempt === 3);
    const c = spawn(s4.message);
    expect(await r.report(s4, c)).toBe("bound");
    r.fake.answer(c, '{"n":7}');
    const s5 = await stepOf((s) => s.call === "explorer.2");
    const d = spawn(s5.message);
    expect(await r.report(s5, d)).toBe("bound");
    r.fake.answer(d, '{"n":8}');
    expect(await p2.done).toEqual({ state: "completed", result: [7, 8] });

    const turns = of(r.rows(), "turn_started").filter((t) => t.call === "explorer.1");
    expect(turns.map((t) => [t.marker, t.conversation_turn, t.replaces_turn])).toEqual([
      ["explorer.1/t1-a1", 1, undefined],
      ["explorer.1/t2-a1", 2, undefined],
      ["explorer.1/t3-a2", 2, 2], // the held repair, on a new subagent at the next k
      ["explorer.1/t3-a3", 2, 2], // the next attempt of that lost turn
    ]);
    const published = of(r.rows(), "step_published").filter((s) => s.call === "explorer.1");
    expect(published.map((s) => [s.marker, s.conversation_turn, s.replaces_turn])).toEqual([
      ["explorer.1/t1-a1", 1, undefined],
      ["explorer.1/t2-a1", 2, undefined],
      ["explorer.1/t3-a2", 2, 2],
      ["explorer.1/t3-a3", 2, 2],
    ]);
    // the conversation holds each place once, the newest turn at it
    const callRows = r.rows().filter((x) => "call" in x && x.call === "explorer.1");
    expect(conversationOf("explorer.1", callRows).map((t) => t.marker)).toEqual([
      "explorer.1/t1-a1",
      "explorer.1/t3-a3",
    ]);
    // the continuation's record is built from that list alone
    const packet = readFileSync(s5.packet, "utf8");
    expect(packet).toContain("conversation turn 1 (explorer.1/t1-a1)");
    expect(packet).toContain("conversation turn 2 (explorer.1/t3-a3)");
    expect(packet).not.toContain("(explorer.1/t2-a1)");
    expect(packet).not.toContain("(explorer.1/t3-a2)");
  });
});
