import {
  ExecutionAuthorityError,
  runInDispatchedTurn,
  SessionViews,
  type SubagentRunnerHost,
  tapSnapshotSchema,
} from "@crw/subagent";
import { afterEach, describe, expect, it } from "vitest";
import { startHost, turn, waitFor } from "./support/runners.js";

const hosts: SubagentRunnerHost[] = [];
afterEach(async () => {
  await Promise.all(hosts.splice(0).map((h) => h.shutdown(1_000)));
});

describe("a read-only view has no execution authority", () => {
  it("the runner takes a tap's snapshot with includeExecution: false, even while the child's turn runs", async () => {
    const { host } = await startHost();
    hosts.push(host);
    const running = host.runTurn(
      turn({
        sessionId: "viewed",
        prompt: "watch me",
        script: [
          { kind: "text", text: "working" },
          { kind: "wait", ms: 1_500 },
        ],
      }),
    );
    const seen: string[] = [];
    await waitFor(async () => {
      const probe = await host.tap("viewed", () => {});
      await probe.close();
      return probe.snapshot.live.length > 0;
    });
    const view = await host.tap("viewed", (e) => seen.push(e.kind));
    // Resolving the execution needs the dispatched turn's authority, which a tap never has: asked with
    // includeExecution: true the seam would have refused; the view gets the snapshot without it.
    expect(view.snapshot).toMatchObject({ sessionId: "viewed", live: [{ kind: "text", text: "working" }] });
    expect("execution" in view.snapshot).toBe(false);
    expect(tapSnapshotSchema.safeParse(view.snapshot).success).toBe(true);
    await view.close();
    expect((await running).stopReason).toBe("end");
  });

  it("the snapshot seam resolves execution only under the dispatched turn of that very session", () => {
    const views = new SessionViews(() => {});
    views.beginTurn(turn({ turnId: "turn-a", sessionId: "child-a", prompt: "p" }));
    const page = { limit: 10 };
    const signal = new AbortController().signal;
    expect(() => views.snapshot("child-a", page, { includeExecution: true })).toThrow(
      ExecutionAuthorityError,
    );
    expect(() =>
      runInDispatchedTurn({ turnId: "turn-b", sessionId: "child-b", signal }, () =>
        views.snapshot("child-a", page, { includeExecution: true }),
      ),
    ).toThrow(ExecutionAuthorityError);
    const own = runInDispatchedTurn({ turnId: "turn-a", sessionId: "child-a", signal }, () =>
      views.snapshot("child-a", page, { includeExecution: true }),
    );
    expect(own.execution).toEqual({ turnId: "turn-a" });
    // A view subscribed from inside that turn's context still takes the authority-free snapshot.
    const viewed = runInDispatchedTurn({ turnId: "turn-a", sessionId: "child-a", signal }, () =>
      views.subscribe("tap-1", "child-a", page),
    );
    expect(viewed.execution).toBeUndefined();
  });
});
