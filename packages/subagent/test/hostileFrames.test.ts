import { parseInputFrame } from "@crw/subagent";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { bootFrame as boot, forkRunner } from "./support/forked.js";
import { waitFor } from "./support/runners.js";
import { tempDir } from "./support/tmp.js";

/**
 * A hostile daemon: fuzzed frames sent straight down a real runner's IPC channel. The runner must refuse
 * and log every one, act on none, and keep serving the real protocol afterwards.
 */
const hostile = fc.oneof(
  fc.anything({ maxDepth: 3 }),
  fc.record({
    type: fc.constantFrom(
      "boot",
      "turn",
      "abort",
      "release",
      "tap",
      "shutdown",
      "hostRpcReply",
      "sessionTurn",
    ),
    requestId: fc.oneof(fc.string(), fc.integer(), fc.constant(null)),
    turn: fc.anything({ maxDepth: 2 }),
  }),
  fc.record({ type: fc.constant("shutdown"), requestId: fc.string({ minLength: 1 }), extra: fc.anything() }),
  fc.record({
    type: fc.constant("turn"),
    requestId: fc.string({ minLength: 1 }),
    turn: fc.record({ turnId: fc.string(), prompt: fc.string() }),
  }),
);

describe("a real runner under hostile frames", () => {
  it("fuzzed frames before and after boot are refused and logged; the runner keeps serving (S004-151)", async () => {
    const r = forkRunner();
    await waitFor(() => r.frames.some((f) => f.type === "hello"));
    // What crosses the channel is the JSON form; keep the frames the protocol refuses in that form.
    const samples = fc
      .sample(hostile, { numRuns: 400, seed: 42 })
      .map((f) => (f === undefined ? null : JSON.parse(JSON.stringify(f) ?? "null")))
      .filter((f) => !parseInputFrame(f).ok)
      .slice(0, 300);
    expect(samples.length).toBeGreaterThan(200);
    for (const frame of samples.slice(0, 150)) r.child.send(frame as never);
    r.child.send(boot);
    await waitFor(() => r.frames.some((f) => f.type === "bootReply"));
    for (const frame of samples.slice(150)) r.child.send(frame as never);
    r.child.send({
      type: "turn",
      requestId: "real",
      turn: { turnId: "t", channelId: "c", sessionId: "s", prompt: "still here" },
    });
    await waitFor(() => r.frames.some((f) => f.type === "turnReply" && f.requestId === "real"), 20_000);
    const reply = r.frames.find((f) => f.type === "turnReply" && f.requestId === "real");
    expect(reply).toMatchObject({ result: { ok: { text: "done: still here", stopReason: "end" } } });
    // Only the real requests were answered, and the runner never posted an invalid frame.
    const answered = r.frames
      .filter((f) =>
        ["bootReply", "turnReply", "releaseReply", "tapReply", "ack", "sessionTurnReply"].includes(f.type),
      )
      .map((f) => f.requestId);
    expect(answered).toEqual(["boot", "real"]);
    expect(r.invalid).toEqual([]);
    expect(r.stderr()).toMatch(/refused invalid frame/);
    expect(r.child.exitCode).toBeNull();
  });

  it("when the daemon's channel goes away the runner exits on its own and runs no further step of its turn (S004-135)", async () => {
    const { readFile } = await import("node:fs/promises");
    const { join } = await import("node:path");
    const dir = tempDir("disconnect");
    const marker = join(dir, "effects.log");
    const r = forkRunner();
    await waitFor(() => r.frames.some((f) => f.type === "hello"));
    r.child.send(boot);
    await waitFor(() => r.frames.some((f) => f.type === "bootReply"));
    r.child.send({
      type: "turn",
      requestId: "long",
      turn: {
        turnId: "t",
        channelId: "c",
        sessionId: "s",
        prompt: "p",
        script: [
          { kind: "appendFile", path: marker, line: "before" },
          { kind: "wait", ms: 60_000 },
          { kind: "appendFile", path: marker, line: "after" },
        ],
      },
    });
    await waitFor(async () => (await readFile(marker, "utf8").catch(() => "")).includes("before"));
    const exited = new Promise<number | null>((res) => r.child.once("exit", (code) => res(code)));
    r.child.disconnect();
    expect(await exited).toBe(0);
    expect(await readFile(marker, "utf8")).toBe("before\n");
  });
});
