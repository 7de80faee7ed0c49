import { useTestDatabase } from "@crw/tools/pg";
import { describe, expect, it } from "vitest";
import {
  createScriptedTurnRunner,
  parseDelegatedExecutionScope,
  type SessionTurnRunner,
} from "../../src/index.js";
import { answeredChild, makeService, newParent } from "./helpers.js";

const db = useTestDatabase();

/**
 * The scripted runner, except for turns of `held`: those wait until their request's signal aborts, as a
 * turn queued for a runner or waiting on its model would, and end aborted.
 */
function holdingRunner() {
  const scripted = createScriptedTurnRunner();
  const state = { held: "", running: () => {} };
  const runner: SessionTurnRunner = {
    async runTurn(request, host) {
      if (request.sessionId !== state.held) return scripted.runTurn(request, host);
      state.running();
      await new Promise<void>((resolve) => {
        if (request.signal.aborted) resolve();
        request.signal.addEventListener("abort", () => resolve(), { once: true });
      });
      return { stopReason: "aborted" };
    },
  };
  return { runner, state };
}

describe("a child turn's caller can stop it", () => {
  it("the signal given to runChildTurn reaches the running session turn: aborting it ends the turn as aborted", async () => {
    const { runner, state } = holdingRunner();
    const { service, repo } = makeService(db.pool, { runner });
    const { account, parent } = await newParent(service);
    const child = await repo.getSession(
      await answeredChild(service, { parent, account }, "c", "ready"),
      account.id,
    );
    state.held = child.id;
    const running = new Promise<void>((r) => {
      state.running = r;
    });
    const controller = new AbortController();
    const turn = service.runChildTurn(
      child,
      parseDelegatedExecutionScope(child.scope ?? ""),
      () => {},
      controller.signal,
    );
    // the turn is in the runner, past the bracket's own check of the signal
    await running;
    controller.abort();
    const { outcome } = await Promise.race([
      turn,
      new Promise<never>((_, no) => setTimeout(() => no(new Error("the turn never ended")), 5_000)),
    ]);
    expect(outcome.stopReason).toBe("aborted");
    await service.close();
  });
});
