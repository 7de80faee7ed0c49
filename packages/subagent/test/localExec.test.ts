import type { LocalExecHandler, SubagentRunnerHost } from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { startHost, turn, waitFor } from "./support/runners.js";
import { sandbox } from "./support/sandbox.js";

const hosts: SubagentRunnerHost[] = [];
afterEach(async () => {
  await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
});
async function ready(handler: LocalExecHandler) {
  const { host } = await startHost({ localExec: handler });
  hosts.push(host);
  return host;
}

describe("local execution and background services across the runner boundary", () => {
  it("an admitted service outlives the turn that started it; the turn's end does not cancel it", async () => {
    const box = sandbox();
    const host = await ready(box.handler);
    const result = await host.runTurn(
      turn({ script: [{ kind: "localExec", command: ["sleep", "30"], service: true }] }),
    );
    expect(result.stopReason).toBe("end");
    expect(box.started).toHaveLength(1);
    expect(host.serviceStreamCount).toBe(1);
    await new Promise((r) => setTimeout(r, 100));
    expect(box.started[0]?.signal.aborted).toBe(false);
  });

  it("an unadmitted start stays turn-bound: aborting the turn cancels it", async () => {
    const box = sandbox();
    const host = await ready(box.handler);
    const controller = new AbortController();
    const running = host.runTurn(
      turn({ script: [{ kind: "localExec", command: ["sleep", "30"], service: false }] }),
      {
        signal: controller.signal,
      },
    );
    await waitFor(() => box.started.length === 1);
    controller.abort();
    await running.catch(() => {});
    await waitFor(() => box.started[0]?.signal.aborted === true);
    expect(host.serviceStreamCount).toBe(0);
  });

  it("registry cancellation sends the original call and turn ids; the final exit removes the entry", async () => {
    const box = sandbox();
    const host = await ready(box.handler);
    const first = turn({
      sessionId: "svc",
      script: [{ kind: "localExec", command: ["sleep", "30"], service: true }],
    });
    await host.runTurn(first);
    expect(host.serviceStreamCount).toBe(1);
    // A later turn stops the services: the cancel names the turn that started the service, not this one.
    await host.runTurn(turn({ sessionId: "svc", script: [{ kind: "stopServices" }] }));
    await waitFor(() => box.started[0]?.signal.aborted === true);
    expect(box.started[0]?.turnId).toBe(first.turnId);
    await waitFor(() => host.serviceStreamCount === 0);
  });

  it("runner exit aborts every retained service stream; none is replayed", async () => {
    const box = sandbox();
    const host = await ready(box.handler);
    await host.runTurn(
      turn({
        script: [
          { kind: "localExec", command: ["sleep", "30"], service: true },
          { kind: "localExec", command: ["sleep", "30"], service: true },
        ],
      }),
    );
    expect(host.serviceStreamCount).toBe(2);
    host.kill();
    await host.exited;
    expect(box.started.map((s) => s.signal.aborted)).toEqual([true, true]);
    expect(host.serviceStreamCount).toBe(0);
    await new Promise((r) => setTimeout(r, 200));
    expect(box.started).toHaveLength(2);
  });

  it("a start needs an active admitted turn; one retained controller per live service (S004-113)", async () => {
    const box = sandbox();
    const handled: string[] = [];
    const host = await ready((request, ctx) => {
      handled.push(request.op);
      return box.handler(request, ctx);
    });
    const out = await host.runTurn(
      turn({ script: [{ kind: "localExec", command: ["sh", "-c", "echo hi"], service: false }] }),
    );
    expect(out.stopReason).toBe("end");
    expect(host.serviceStreamCount).toBe(0);
    await host.runTurn(turn({ script: [{ kind: "localExec", command: ["sleep", "30"], service: true }] }));
    expect(host.serviceStreamCount).toBe(1);
    const { LocalExecClient } = await import("@crw/subagent");
    const sent: unknown[] = [];
    const client = new LocalExecClient((f) => {
      sent.push(f);
      return true;
    });
    const outside = client.call({ op: "start", command: ["true"], service: false });
    await expect(outside.final).rejects.toMatchObject({ reason: "outside_turn" });
    const stdin = client.call({ op: "stdin", processId: "1", data: "x" });
    await expect(stdin.final).rejects.toMatchObject({ reason: "outside_turn" });
    expect(sent).toEqual([]);
    expect(handled).toEqual(["start", "start"]);
  });

  it("the daemon side refuses a start or stdin naming a turn that has ended, and never runs it (S004-113)", async () => {
    const box = sandbox();
    const handled: string[] = [];
    const host = await ready((request, ctx) => {
      handled.push(request.op);
      return box.handler(request, ctx);
    });
    const ended = turn({ script: [{ kind: "localExec", command: ["sh", "-c", "true"], service: false }] });
    await host.runTurn(ended);
    expect(handled).toEqual(["start"]);
    // What a runner would send after its turn ended, straight into the host's channel.
    const child = (host as unknown as { child: import("node:child_process").ChildProcess }).child;
    const posted: Array<{ type: string; requestId?: string; result?: unknown }> = [];
    const send = child.send.bind(child);
    child.send = ((frame: (typeof posted)[number], ...rest: never[]) => {
      posted.push(frame);
      return send(frame, ...rest);
    }) as typeof child.send;
    const late = [
      { requestId: "late-start", request: { op: "start", command: ["true"], service: false } },
      { requestId: "late-stdin", request: { op: "stdin", processId: "1", data: "x" } },
    ];
    for (const frame of late) child.emit("message", { type: "localExec", turnId: ended.turnId, ...frame });
    await waitFor(() => posted.filter((f) => f.type === "localExecResult").length === 2);
    for (const { requestId } of late)
      expect(posted.find((f) => f.requestId === requestId)).toMatchObject({
        result: { error: { code: "outside_turn" } },
      });
    expect(handled).toEqual(["start"]);
  });
});
