import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  functionOutputs,
  MockModel,
  type RealCodex,
  restartRealCodex,
  startRealCodex,
  userTexts,
} from "@crw/tools/codex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AppServerHost, createAppServerHost } from "../../src/index.js";

/**
 * The thread operations of the app-server backend against the real app-server: a thread started with the
 * call's pair and environment entries as `shell_environment_policy.set.<NAME>` leaf keys; after a restart
 * the thread is resumed with the entries again (the server keeps them nowhere).
 */

let model: MockModel;
let codex: RealCodex;
let root: string;
let host: AppServerHost;

function ok<T>(result: { ok: true; value: T } | { ok: false; reason: string; message: string }): T {
  if (!result.ok) throw new Error(`expected ok, got ${result.reason}: ${result.message}`);
  return result.value;
}

/** Runs a turn that echoes $CRW_X in the thread's shell; answers what the command printed. */
async function echoInThread(threadId: string): Promise<string> {
  const before = model.requests.length;
  const { turnId } = ok(await host.startTurn(threadId, "echo-env"));
  await expect
    .poll(async () => ok(await host.readThread(threadId)).turns.find((t) => t.id === turnId)?.status, {
      timeout: 30_000,
      interval: 100,
    })
    .toBe("completed");
  // The request that carries this turn's command output last (earlier turns' outputs are history).
  const answered = model.requests.slice(before).find((r) => r.input.at(-1)?.type === "function_call_output");
  if (!answered) return "(the command's output never reached the model)";
  const output = functionOutputs(answered).at(-1)?.output ?? "";
  return /x=(\S*)/.exec(output)?.[0] ?? output;
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "crw-real-codex-threads-"));
  model = await MockModel.start();
  model.otherwise((request) => {
    const last = request.input.at(-1);
    if (userTexts(request).at(-1) === "echo-env" && last?.type === "message") {
      return {
        items: [{ type: "function_call", name: "exec_command", arguments: { cmd: 'echo "x=$CRW_X"' } }],
      };
    }
    return { items: [{ type: "message", text: "done", phase: "final_answer" }] };
  });
  codex = await startRealCodex({
    home: join(root, "home"),
    cwd: root,
    baseUrl: model.baseUrl,
    models: ["mock-call"],
  });
  host = createAppServerHost({ transport: codex.url });
}, 60_000);

afterAll(async () => {
  await host?.close();
  await codex?.stop();
  await model?.stop();
  if (root) rmSync(root, { recursive: true, force: true });
});

describe("app-server backend thread operations, real codex", () => {
  let threadId: string;

  it("thread/start carries the call's pair and its environment entries into the thread's shell", async () => {
    const thread = ok(
      await host.startThread({
        cwd: root,
        model: "mock-call",
        reasoningEffort: "high",
        env: { CRW_X: "42" },
      }),
    );
    threadId = thread.id;
    expect(thread).toMatchObject({
      model: "mock-call",
      reasoningEffort: "high",
      parentThreadId: null,
      cwd: root,
    });
    expect(await echoInThread(threadId)).toBe("x=42");
  });

  it("after a restart the thread is resumed with the entries again; resumed without them, they are gone", async () => {
    codex = await restartRealCodex(codex);
    expect(ok(await host.readThread(threadId)).status).toEqual({ type: "notLoaded" });
    const resumed = ok(await host.resumeThread(threadId, { env: { CRW_X: "43" } }));
    expect(resumed.id).toBe(threadId);
    expect(await echoInThread(threadId)).toBe("x=43");
    codex = await restartRealCodex(codex);
    ok(await host.resumeThread(threadId));
    expect(await echoInThread(threadId)).toBe("x=");
  });

  it("thread/fork makes a new thread with its own entries", async () => {
    const fork = ok(await host.forkThread(threadId, { env: { CRW_X: "44" } }));
    expect(fork.id).not.toBe(threadId);
    expect(await echoInThread(fork.id)).toBe("x=44");
  });

  it("an entry name that is no variable name is refused before anything is sent", async () => {
    const before = (await host.request("thread/loaded/list", {})) as { ok: true; value: { data: string[] } };
    const refused = await host.startThread({ env: { "A B": "1" } });
    expect(refused).toMatchObject({ ok: false, reason: "protocol" });
    expect(refused.ok ? "" : refused.message).toMatch(/'A B' is not a variable name/);
    const after = (await host.request("thread/loaded/list", {})) as { ok: true; value: { data: string[] } };
    expect(after.value.data.length).toBe(before.value.data.length);
  });
});
