import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { TranscriptMessage } from "@crw/db";
import { afterAll, describe, expect, it } from "vitest";
import { type ChildTurnInput, runChildTurn, type ScriptStep } from "../../src/agent/index.js";
import {
  captureDelegatedExecutionScope,
  forDelegatedTurn,
  parseDelegatedExecutionScope,
} from "../../src/scope/index.js";

const root = realpathSync(mkdtempSync(join(tmpdir(), "crw-turn-")));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
function workDir(): string {
  const dir = join(root, `w${n++}`);
  mkdirSync(dir);
  return dir;
}

function scope(dir: string, extra: Record<string, unknown> = {}) {
  return captureDelegatedExecutionScope({
    accountId: "acct",
    target: { kind: "host", ref: "p" },
    workDir: dir,
    ...extra,
  });
}

function turn(
  dir: string,
  script: ScriptStep[],
  extra: Partial<ChildTurnInput> = {},
): Promise<Awaited<ReturnType<typeof runChildTurn>>> {
  return runChildTurn({
    sessionId: "child-1",
    systemPrompt: "You are a worker.",
    messages: [],
    input: "do the task",
    scope: scope(dir),
    workDir: dir,
    model: { api: "scripted", script },
    ...extra,
  });
}

describe("runChildTurn with the scripted provider", () => {
  it("answers deterministically with no script, and reports the outcome", async () => {
    const dir = workDir();
    const out = await turn(dir, [], { input: "summarise the repo\nsecond line" });
    expect(out.stopReason).toBe("stop");
    expect(out.finalText).toBe("Done: summarise the repo");
    expect(out.messages).toEqual([
      { role: "user", content: "summarise the repo\nsecond line" },
      {
        role: "assistant",
        content: [{ type: "text", text: "Done: summarise the repo" }],
        stopReason: "stop",
        model: "scripted",
      },
    ]);
    expect(out.usage.providerCalls).toBe(1);
    expect(out.usage.totalTokens).toBeGreaterThan(0);
  });

  it("runs real tools in the workDir, writes intents before effects, and records every call", async () => {
    const dir = workDir();
    const intents: string[] = [];
    const seenAtIntent: boolean[] = [];
    const journal: TranscriptMessage[] = [];
    const out = await turn(
      dir,
      [
        {
          text: "writing",
          toolCalls: [{ name: "write", arguments: { path: "notes/a.txt", content: "alpha\nbeta\n" } }],
        },
        {
          toolCalls: [
            { name: "edit", arguments: { path: "notes/a.txt", oldText: "beta", newText: "gamma" } },
          ],
        },
        {
          toolCalls: [
            { name: "read", arguments: { path: "notes/a.txt" } },
            { name: "shell", arguments: { command: "wc -l notes/a.txt" } },
          ],
        },
        { text: "  all done  " },
      ],
      {
        hooks: {
          onToolIntent: (intent) => {
            intents.push(`${intent.toolName}:${intent.toolCallId}`);
            if (intent.toolName === "write") seenAtIntent.push(existsSync(join(dir, "notes/a.txt")));
          },
          onMessage: (m) => {
            journal.push(m);
          },
        },
      },
    );
    expect(out.stopReason).toBe("stop");
    expect(out.finalText).toBe("  all done  ");
    expect(readFileSync(join(dir, "notes/a.txt"), "utf8")).toBe("alpha\ngamma\n");
    expect(seenAtIntent).toEqual([false]);
    expect(intents).toEqual(["write:call_0_0", "edit:call_1_0", "read:call_2_0", "shell:call_2_1"]);
    expect(out.toolCalls.map((c) => [c.toolName, c.isError])).toEqual([
      ["write", false],
      ["edit", false],
      ["read", false],
      ["shell", false],
    ]);
    expect(out.toolCalls[2]?.result).toBe("alpha\ngamma\n");
    expect(out.toolCalls[3]?.result).toContain("2 notes/a.txt");
    expect(journal).toEqual(out.messages);
    expect(out.messages.map((m) => m.role)).toEqual([
      "user",
      "assistant",
      "toolResult",
      "assistant",
      "toolResult",
      "assistant",
      "toolResult",
      "toolResult",
      "assistant",
    ]);
    expect(out.usage.providerCalls).toBe(4);
  });

  it("refuses a call outside the allow-list with a typed error and never runs it", async () => {
    const dir = workDir();
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            { name: "write", arguments: { path: "x.txt", content: "x" } },
            { name: "shell", arguments: { command: "touch y.txt" } },
          ],
        },
        { text: "ok" },
      ],
      { scope: scope(dir, { tools: { allow: ["read", "shell(git *)"] } }) },
    );
    expect(existsSync(join(dir, "x.txt"))).toBe(false);
    expect(existsSync(join(dir, "y.txt"))).toBe(false);
    expect(out.toolCalls.map((c) => c.refused?.code)).toEqual(["tool_not_allowed", "tool_not_allowed"]);
    expect(out.toolCalls[0]?.refused?.name).toBe("ToolCallRefusedError");
    expect(out.toolCalls.every((c) => c.isError)).toBe(true);
    expect(out.stopReason).toBe("stop");
  });

  it("honours denials, read-only and the working directory boundary", async () => {
    const dir = workDir();
    writeFileSync(join(dir, "f.txt"), "one");
    mkdirSync(join(root, "secret"), { recursive: true });
    writeFileSync(join(root, "secret", "s.txt"), "secret");
    symlinkSync(join(root, "secret"), join(dir, "link"));
    const denied = await turn(
      dir,
      [{ toolCalls: [{ name: "shell", arguments: { command: "rm f.txt" } }] }, { text: "." }],
      {
        scope: scope(dir, { tools: { deny: ["shell(rm *)"] } }),
      },
    );
    expect(denied.toolCalls[0]?.refused?.code).toBe("tool_denied");
    expect(existsSync(join(dir, "f.txt"))).toBe(true);

    const readOnly = await turn(
      dir,
      [
        {
          toolCalls: [
            { name: "write", arguments: { path: "f.txt", content: "two" } },
            { name: "shell", arguments: { command: "echo two > f.txt" } },
            { name: "shell", arguments: { command: "cat f.txt | wc -c" } },
          ],
        },
        { text: "." },
      ],
      { readOnly: true },
    );
    // The write tool is refused before it runs; the shell runs in a read-only sandbox and its write fails.
    expect(readOnly.toolCalls.map((c) => c.refused?.code ?? "ran")).toEqual(["read_only", "ran", "ran"]);
    expect(readOnly.toolCalls.map((c) => c.isError)).toEqual([true, true, false]);
    expect(readOnly.toolCalls[1]?.result).toContain("Read-only file system");
    expect(readOnly.toolCalls[2]?.result).toContain("3");
    expect(readFileSync(join(dir, "f.txt"), "utf8")).toBe("one");

    const escaped = await turn(dir, [
      {
        toolCalls: [
          { name: "read", arguments: { path: "../secret/s.txt" } },
          { name: "read", arguments: { path: "link/s.txt" } },
        ],
      },
      { text: "." },
    ]);
    expect(escaped.toolCalls.map((c) => c.refused?.code ?? c.result)).toEqual([
      "outside_work_dir",
      expect.stringContaining("outside the working directory"),
    ]);
    expect(escaped.toolCalls.every((c) => c.isError)).toBe(true);
  });

  it("blocks a tool call whose intent could not be recorded", async () => {
    const dir = workDir();
    const out = await turn(
      dir,
      [{ toolCalls: [{ name: "write", arguments: { path: "z.txt", content: "z" } }] }, { text: "." }],
      {
        hooks: {
          onToolIntent: () => {
            throw new Error("database unavailable");
          },
        },
      },
    );
    expect(existsSync(join(dir, "z.txt"))).toBe(false);
    expect(out.toolCalls[0]?.refused?.message).toBe("database unavailable");
  });

  it("steers delivered messages into the PI agent after the current tool round, before the next provider request, first in first out (S004-027 S004-028)", async () => {
    const dir = workDir();
    const queue: TranscriptMessage[] = [
      { role: "custom", customType: "delegation_result", content: "result A" },
      { role: "custom", customType: "delegation_result", content: "result B" },
    ];
    let drains = 0;
    const out = await turn(
      dir,
      [{ toolCalls: [{ name: "shell", arguments: { command: "true" } }] }, { text: "saw {{last}}" }],
      {
        hooks: {
          drainSteering: () => {
            drains++;
            return queue.splice(0);
          },
        },
      },
    );
    expect(out.messages.map((m) => (m.role === "custom" ? m.content : m.role))).toEqual([
      "user",
      "assistant",
      "toolResult",
      "result A",
      "result B",
      "assistant",
    ]);
    expect(out.messages[3]).toEqual({ role: "custom", customType: "delegation_result", content: "result A" });
    expect(out.finalText).toBe("saw result B");
    // Drained once, after the tool round; the final answer ends the turn without another drain.
    expect(drains).toBe(1);
  });

  it("a result that waits while a tool round runs cuts no tool short: every tool ends with its own result, then the result follows (S004-071)", async () => {
    const dir = workDir();
    const log: string[] = [];
    let waiting: TranscriptMessage[] = [
      { role: "custom", customType: "delegation_result", content: "arrived meanwhile" },
    ];
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            { name: "shell", arguments: { command: "sleep 0.2; echo one" } },
            { name: "shell", arguments: { command: "echo two" } },
          ],
        },
        { text: "saw {{last}}" },
      ],
      {
        hooks: {
          onProgress: (e) => {
            if (e.type === "tool_end") log.push(`end ${e.isError ? "error" : "ok"}`);
          },
          drainSteering: () => {
            log.push("drain");
            const taken = waiting;
            waiting = [];
            return taken;
          },
        },
      },
    );
    expect(log).toEqual(["end ok", "end ok", "drain"]);
    expect(out.toolCalls.map((c) => [c.isError, c.result.trim().split("\n").at(-1)])).toEqual([
      [false, "one"],
      [false, "two"],
    ]);
    expect(out.messages.map((m) => (m.role === "custom" ? m.content : m.role))).toEqual([
      "user",
      "assistant",
      "toolResult",
      "toolResult",
      "arrived meanwhile",
      "assistant",
    ]);
  });

  it("reports a provider error as an outcome, not a rejection, and an abort as aborted", async () => {
    const dir = workDir();
    const failed = await turn(dir, [{ stopReason: "error", errorMessage: "rate limited" }]);
    expect(failed.stopReason).toBe("error");
    expect(failed.errorMessage).toBe("rate limited");
    const controller = new AbortController();
    controller.abort();
    const aborted = await turn(dir, [{ text: "never" }], { signal: controller.signal });
    expect(aborted.stopReason).toBe("aborted");
  });

  it("a failing journal hook ends the turn with an error outcome", async () => {
    const dir = workDir();
    const out = await turn(dir, [{ text: "hi" }], {
      hooks: {
        onMessage: (m) => {
          if (m.role === "assistant") throw new Error("journal write failed");
        },
      },
    });
    expect(out.stopReason).toBe("error");
    expect(out.errorMessage).toBe("journal write failed");
  });

  it("continues from a transcript and picks the same next scripted step a fresh run would", async () => {
    const dir = workDir();
    const script: ScriptStep[] = [
      { toolCalls: [{ name: "shell", arguments: { command: "echo 1" } }] },
      { text: "second" },
      { text: "third" },
    ];
    const first = await turn(dir, script);
    expect(first.finalText).toBe("second");
    const history = first.messages;
    const next = await turn(dir, script, { messages: history, input: "and now?" });
    expect(next.finalText).toBe("third");
    const interrupted: TranscriptMessage[] = [
      ...history,
      { role: "custom", customType: "interrupted", content: "the daemon restarted" },
    ];
    const resumed = await turn(dir, script, { messages: interrupted, input: undefined });
    expect(resumed.finalText).toBe("third");
    expect(resumed.messages.map((m) => m.role)).toEqual(["assistant"]);
  });

  it("stops a runaway turn at its provider request bound", async () => {
    const dir = workDir();
    const loop: ScriptStep[] = Array.from({ length: 20 }, () => ({
      toolCalls: [{ name: "shell", arguments: { command: "true" } }],
    }));
    const out = await turn(dir, loop, { limits: { maxProviderCalls: 3 } });
    expect(out.stopReason).toBe("error");
    expect(out.errorMessage).toContain("limit of 3");
    expect(out.usage.providerCalls).toBe(3);
  });

  it("refuses invalid input before anything runs", async () => {
    const dir = workDir();
    await expect(turn(dir, [], { workDir: "relative" })).rejects.toMatchObject({
      name: "AgentConfigError",
      code: "invalid_turn_input",
    });
    await expect(turn(dir, [], { input: undefined })).rejects.toMatchObject({ code: "invalid_turn_input" });
    await expect(turn(dir, [], { scope: "{}" })).rejects.toMatchObject({ name: "DelegatedScopeError" });
    await expect(turn(dir, [], { model: { api: "openai-responses", modelId: "" } })).rejects.toMatchObject({
      code: "invalid_model_config",
    });
    await expect(
      turn(dir, [], {
        messages: [{ role: "assistant", content: [], stopReason: "weird" } as unknown as TranscriptMessage],
      }),
    ).rejects.toMatchObject({ code: "invalid_turn_input" });
  });
});

describe("scripted provider: a script carried in the task", () => {
  it("follows the newest {steps} task and counts from it, so a recovered session continues the same script", async () => {
    const dir = workDir();
    const task = JSON.stringify({
      steps: [
        { toolCalls: [{ name: "shell", arguments: { command: "echo hi" } }] },
        { text: "own script done" },
      ],
    });
    const first = await turn(dir, [], { input: task });
    expect(first.finalText).toBe("own script done");
    expect(first.toolCalls[0]?.result).toContain("hi");
    // After the script ends, later input gets the default answer.
    const later = await turn(dir, [], { messages: first.messages, input: "anything else?" });
    expect(later.finalText).toBe("Done: anything else?");
  });
});

describe("shell bounds", () => {
  // A killed process may stay a zombie until something reaps it; only a running one counts as alive.
  const alive = (pid: number) => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return !/^\d+ \(.*\) [ZX]/.test(stat);
    } catch {
      return false;
    }
  };
  // The command runs in its own pid namespace: its `$!` means nothing here, so find it by its command line.
  const running = (cmdline: string) =>
    readdirSync("/proc").some((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, "utf8") === cmdline && alive(Number(pid));
      } catch {
        return false;
      }
    });
  const waitGone = async (cmdline: string) => {
    for (let i = 0; i < 100 && running(cmdline); i++) await new Promise((r) => setTimeout(r, 20));
    return !running(cmdline);
  };
  const untilExists = async (path: string) => {
    for (let i = 0; i < 500 && !existsSync(path); i++) await new Promise((r) => setTimeout(r, 10));
  };

  it("kills a shell command at its timeout and reports it as a failed call", async () => {
    const dir = workDir();
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            {
              name: "shell",
              arguments: { command: "(sleep 3.25; echo late > late.txt) & echo started > started.txt; wait" },
            },
          ],
        },
        { text: "." },
      ],
      {
        // long enough for a sandboxed shell to start on a loaded host
        limits: { shellTimeoutMs: 1000 },
      },
    );
    expect(out.toolCalls[0]?.isError).toBe(true);
    expect(out.toolCalls[0]?.result).toContain("timed out after 1000 ms");
    // The whole process group went, the shell's own children included: the late write never happens.
    expect(existsSync(join(dir, "started.txt"))).toBe(true);
    expect(await waitGone("sleep\u00003.25\u0000")).toBe(true);
    expect(existsSync(join(dir, "late.txt"))).toBe(false);
  });

  it("an abort during a tool kills its process group and ends the turn as aborted", async () => {
    const dir = workDir();
    const controller = new AbortController();
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            {
              name: "shell",
              arguments: { command: "(sleep 2.35; echo late > late.txt) & echo started > started.txt; wait" },
            },
          ],
        },
        { text: "." },
      ],
      {
        signal: controller.signal,
        // aborted once the shell has surely started its group (a loaded host can take longer than a fixed wait)
        hooks: {
          onToolIntent: () => void untilExists(join(dir, "started.txt")).then(() => controller.abort()),
        },
      },
    );
    expect(out.stopReason).toBe("aborted");
    expect(out.toolCalls[0]?.isError).toBe(true);
    expect(existsSync(join(dir, "started.txt"))).toBe(true);
    expect(await waitGone("sleep\u00002.35\u0000")).toBe(true);
    expect(existsSync(join(dir, "late.txt"))).toBe(false);
  });
});

describe("scope as data", () => {
  it("only the serializable scope crosses the boundary; the tool policy and the identity are rebuilt from it on the other side (S004-209)", async () => {
    const dir = workDir();
    const captured = scope(dir, { tools: { allow: ["read", "shell(ls*)"], deny: ["read(secret*)"] } });
    // What a runner process receives: plain JSON text, no closures, Sets or identity objects.
    const overIpc = JSON.parse(JSON.stringify({ scope: captured })) as { scope: string };
    writeFileSync(join(dir, "secret.txt"), "s");
    writeFileSync(join(dir, "open.txt"), "o");
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            { name: "read", arguments: { path: "open.txt" } },
            { name: "read", arguments: { path: "secret.txt" } },
            { name: "shell", arguments: { command: "ls" } },
            { name: "write", arguments: { path: "x", content: "x" } },
          ],
        },
        { text: "." },
      ],
      { scope: overIpc.scope },
    );
    expect(out.toolCalls.map((c) => c.refused?.code ?? "ran")).toEqual([
      "ran",
      "tool_denied",
      "ran",
      "tool_not_allowed",
    ]);
    // the identity the turn acts for is derived again from the crossed text, not carried beside it
    const parent = { sessionId: "p", accountId: "acct", kind: "root", continuation: false } as const;
    expect(forDelegatedTurn(parseDelegatedExecutionScope(overIpc.scope), parent)).toEqual({
      principalAccountId: "acct",
    });
  });

  it("tool grants, denials, the read-only boundary and the ancestor check stay the ceiling wherever the working directory is placed (S004-271)", async () => {
    const dir = workDir();
    const nested = join(dir, "deep", "er");
    mkdirSync(nested, { recursive: true });
    for (const placement of [dir, nested]) {
      writeFileSync(join(placement, "secret.txt"), "s");
      const calls = [
        { name: "write", arguments: { path: "w.txt", content: "x" } },
        { name: "shell", arguments: { command: "touch t.txt" } },
        { name: "read", arguments: { path: "secret.txt" } },
        { name: "write", arguments: { path: "../up.txt", content: "x" } },
      ];
      const tools = { allow: ["write", "read"], deny: ["read(secret*)"] };
      const boundaries = [{ readOnly: true }, { permissionBoundary: "read-only" }, {}];
      const refused: string[][] = [];
      for (const boundary of boundaries) {
        const out = await turn(placement, [{ toolCalls: calls }, { text: "." }], {
          scope: scope(placement, { tools, ...boundary }),
          workDir: placement,
        });
        refused.push(out.toolCalls.map((c) => c.refused?.code ?? "ran"));
      }
      expect(refused, placement).toEqual([
        ["read_only", "tool_not_allowed", "tool_denied", "outside_work_dir"],
        ["read_only", "tool_not_allowed", "tool_denied", "outside_work_dir"],
        ["ran", "tool_not_allowed", "tool_denied", "outside_work_dir"],
      ]);
      expect(existsSync(join(dirname(placement), "up.txt"))).toBe(false);
      rmSync(join(placement, "w.txt"));
    }
  });
});

describe("follow-up turns", () => {
  it("an idle session's batched results are the turn's input, kept as the journal's custom messages", async () => {
    const dir = workDir();
    const results: TranscriptMessage[] = [
      { role: "custom", customType: "delegation_result", content: "first result" },
      { role: "custom", customType: "delegation_result", content: "second result" },
    ];
    const history: TranscriptMessage[] = [
      { role: "user", content: "start two children" },
      { role: "assistant", content: [{ type: "text", text: "started" }], stopReason: "stop" },
    ];
    const out = await turn(dir, [{ text: "x" }, { text: "got: {{last}}" }], {
      messages: history,
      input: results,
    });
    expect(out.messages.slice(0, 2)).toEqual(results);
    expect(out.finalText).toBe("got: second result");
  });
});

describe("calls to tools the model was not shown", () => {
  it("are refused with the scope's reason, or as unknown", async () => {
    const dir = workDir();
    const out = await turn(
      dir,
      [
        {
          toolCalls: [
            { name: "write", arguments: { path: "a", content: "x" } },
            { name: "shell", arguments: { command: "ls" } },
            { name: "teleport", arguments: {} },
          ],
        },
        { text: "." },
      ],
      { scope: scope(dir, { tools: { allow: ["read", "write"], deny: ["shell"] } }), readOnly: true },
    );
    expect(out.toolCalls.map((c) => c.refused?.code)).toEqual(["read_only", "tool_denied", "unknown_tool"]);
    const noFiles = await turn(
      dir,
      [{ toolCalls: [{ name: "write", arguments: { path: "a", content: "x" } }] }, { text: "." }],
      {
        childTools: false,
      },
    );
    expect(noFiles.toolCalls[0]?.refused?.code).toBe("unknown_tool");
    expect(existsSync(join(dir, "a"))).toBe(false);
  });
});
