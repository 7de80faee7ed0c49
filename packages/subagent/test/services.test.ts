import {
  LocalExecClient,
  LocalExecSessionClosedError,
  runInDispatchedTurn,
  SESSION_CLOSED,
  type SubagentRunnerHost,
} from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { closePoolsAfterEach, makePool } from "./support/pools.js";
import { startHost, turn, waitFor } from "./support/runners.js";
import { sandbox } from "./support/sandbox.js";

closePoolsAfterEach();
const hosts: SubagentRunnerHost[] = [];
afterEach(async () => {
  await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
});

const bash = (args: Record<string, unknown>) => ({ kind: "tool" as const, name: "Bash", args });
const SERVICE = { run_in_background: true, backgroundMode: "service" };

describe("the Bash tool's background services in a runner", () => {
  it("Bash(run_in_background, backgroundMode service) uses the process registry for lifetime and cancellation", async () => {
    const box = sandbox();
    const { host } = await startHost({ localExec: box.handler });
    hosts.push(host);
    const first = turn({
      sessionId: "bash-session",
      script: [
        bash({ command: "exec sleep 30", ...SERVICE }),
        bash({ command: "exec sleep 30", run_in_background: true }),
        bash({ command: "echo hello" }),
      ],
    });
    expect((await host.runTurn(first)).stopReason).toBe("end");
    expect(box.started.map((s) => s.service)).toEqual([true, false, false]);
    // Lifetime: the service was admitted into the registry and outlives the turn; a plain background
    // command was not admitted and ended with the turn.
    await waitFor(() => box.started[1]?.signal.aborted === true);
    expect(box.started[0]?.signal.aborted).toBe(false);
    expect(host.serviceStreamCount).toBe(1);
    const view = await host.tap("bash-session", () => {});
    expect(view.snapshot.history.filter((h) => h.role === "tool").map((h) => h.text)).toEqual([
      `service ${box.started[0]?.pid} started`,
      `background ${box.started[1]?.pid} started`,
      "exit 0\nhello\n",
    ]);
    await view.close();
    // Cancellation: the registry's, naming the call and the turn that started the service.
    await host.runTurn(turn({ sessionId: "bash-session", script: [{ kind: "stopServices" }] }));
    await waitFor(() => box.started[0]?.signal.aborted === true);
    expect(box.started[0]?.turnId).toBe(first.turnId);
    await waitFor(() => host.serviceStreamCount === 0);
  });

  it("service mode without run_in_background is refused before anything starts", async () => {
    const box = sandbox();
    const { host } = await startHost({ localExec: box.handler });
    hosts.push(host);
    await expect(
      host.runTurn(turn({ script: [bash({ command: "exec sleep 30", backgroundMode: "service" })] })),
    ).rejects.toMatchObject({ remote: { name: "BashToolError", code: "invalid_args" } });
    expect(box.started).toEqual([]);
  });

  it("a live service's stream does not heartbeat the settled dispatch: no turn, no progress, no slot held", async () => {
    const box = sandbox();
    const { host, events } = await startHost({ localExec: box.handler, heartbeatIntervalMs: 50 });
    hosts.push(host);
    const progress: string[] = [];
    const result = await host.runTurn(
      turn({
        script: [
          bash({ command: "while true; do echo tick; sleep 0.05; done", ...SERVICE }),
          { kind: "text", text: "service up" },
        ],
      }),
      { onProgress: (t) => progress.push(t) },
    );
    expect(result.text).toBe("service up");
    const progressAtSettlement = progress.length;
    const emittedAtSettlement = box.started[0]?.emitted ?? 0;
    const beatsAtSettlement = events.length;
    const beats = () => events.flatMap((e) => (e.type === "heartbeat" ? [e.heartbeat] : []));
    // A beat is reported once the runner's process tree is measured, so one the runner sent while the turn
    // ran may be reported after the turn settled: the runner's own order (seq) tells which came later.
    const lastBusySeq = () => Math.max(0, ...beats().flatMap((b) => (b.turns > 0 ? [b.seq] : [])));
    const idleAfterTurn = () => beats().filter((b) => b.seq > lastBusySeq());
    // The service keeps streaming to the runner's registry after the dispatched call settled...
    await waitFor(() => (box.started[0]?.emitted ?? 0) > emittedAtSettlement + 3);
    await waitFor(() => events.slice(beatsAtSettlement).filter((e) => e.type === "heartbeat").length >= 2);
    await waitFor(() => idleAfterTurn().length >= 2);
    expect(box.started[0]?.signal.aborted).toBe(false);
    // ...yet nothing of it reaches the settled call, and the runner's own heartbeats count no turn.
    expect(progress).toHaveLength(progressAtSettlement);
    expect(host.activeTurns).toBe(0);
    expect(lastBusySeq()).toBeLessThan(Math.max(...beats().map((b) => b.seq)));
  });

  it("a pool's only slot is free while a service started by a finished turn streams", async () => {
    const box = sandbox();
    const { pool, events } = makePool({ size: { maxRunners: 1, turnsPerRunner: 1 }, localExec: box.handler });
    await pool.runTurn(
      turn({ script: [bash({ command: "while true; do echo tick; sleep 0.05; done", ...SERVICE })] }),
    );
    await waitFor(() => (box.started[0]?.emitted ?? 0) > 3);
    expect(pool.health()).toMatchObject({ turns: 0, queued: 0 });
    const next = await pool.runTurn(turn({ script: [{ kind: "text", text: "next" }] }));
    expect(next.text).toBe("next");
    expect(box.started[0]?.signal.aborted).toBe(false);
    const dispatched = events.flatMap((e) => (e.type === "turn_dispatched" ? [e.runnerId] : []));
    expect(dispatched).toHaveLength(2);
    expect(new Set(dispatched).size).toBe(1);
  });

  it("the service stream reports a lost transport as session.closed, on both sides, and is not replayed", async () => {
    const box = sandbox();
    const { host } = await startHost({ localExec: box.handler });
    hosts.push(host);
    await host.runTurn(
      turn({ script: [bash({ command: "while true; do echo tick; sleep 0.05; done", ...SERVICE })] }),
    );
    expect(host.serviceStreamCount).toBe(1);
    host.kill();
    await host.exited;
    // Daemon side: the handler's stream ends with session.closed as its reason (and its process is killed).
    const reason = box.started[0]?.signal.reason as unknown;
    expect(reason).toBeInstanceOf(LocalExecSessionClosedError);
    expect(reason).toMatchObject({ code: "session_closed", event: SESSION_CLOSED });
    expect(host.serviceStreamCount).toBe(0);
    await new Promise((r) => setTimeout(r, 200));
    expect(box.started).toHaveLength(1);

    // Runner side: the daemon channel closing ends an admitted service in the registry with session.closed.
    const sent: { type: string; requestId?: string }[] = [];
    const client = new LocalExecClient((frame) => {
      sent.push(frame);
      return true;
    });
    const controller = new AbortController();
    const call = runInDispatchedTurn({ turnId: "t1", sessionId: "s1", signal: controller.signal }, () =>
      client.call({ op: "start", command: ["sleep", "30"], service: true }),
    );
    client.event(call.callId, { kind: "process-started", processId: "42" });
    expect(await call.started).toBe("42");
    controller.abort(); // the turn ended: an admitted service is not cancelled by it
    expect(sent.filter((f) => f.type === "localExecCancel")).toEqual([]);
    expect(client.serviceCount).toBe(1);
    client.close();
    await expect(call.final).rejects.toMatchObject({
      name: "LocalExecSessionClosedError",
      event: SESSION_CLOSED,
    });
    expect(client.serviceCount).toBe(0);
    expect(sent.filter((f) => f.type === "localExec")).toHaveLength(1);
  });
});
