import { basename } from "node:path";
import { describe, expect, it } from "vitest";
import { bootFrame as boot, forkRunner } from "./support/forked.js";
import { BUILD_ID, runnerBuildFiles, waitFor } from "./support/runners.js";

/**
 * Fork-to-ready is the runner's boot path alone: the handshake, the boot frame's own validator, heartbeats.
 * The frame schemas (zod) and everything a turn runs are imported after the boot reply. These tests hold the
 * built runner to that, so a static import re-added anywhere on the boot path fails here.
 */
const npmFreeBoot = new URL("./support/npm-free-boot.mjs", import.meta.url).href;

describe("the runner's boot path", () => {
  it("reaches ready while every npm import and zod are refused; the first one comes after the boot reply", async () => {
    const r = forkRunner(["--import", npmFreeBoot]);
    await waitFor(() => r.frames.length > 0 || r.hasExited(), 20_000);
    expect(r.frames[0]?.type, r.stderr()).toBe("hello");
    r.child.send(boot);
    await waitFor(() => r.frames.some((f) => f.type === "bootReply") || r.hasExited(), 20_000);
    expect(
      r.frames.find((f) => f.type === "bootReply"),
      r.stderr(),
    ).toMatchObject({
      requestId: "boot",
      result: { ok: { buildId: BUILD_ID, policyRevision: 1 } },
    });
    // The request handling is imported right after ready; under the hook that import fails and the runner,
    // unable to read any further frame, exits.
    expect(await r.exited).toBe(1);
    expect(r.stderr()).toMatch(
      /runner could not load its request handling.*refused by the npm-free boot hook/,
    );
  });

  it("without the hook the same runner serves its first turn after the import", async () => {
    const r = forkRunner([]);
    await waitFor(() => r.frames.some((f) => f.type === "hello"));
    r.child.send(boot);
    // Sent at once: the turn waits for the import behind the boot reply instead of racing it.
    r.child.send({
      type: "turn",
      requestId: "first",
      turn: { turnId: "t", channelId: "c", sessionId: "s", prompt: "right after boot" },
    });
    await waitFor(() => r.frames.some((f) => f.type === "turnReply"), 20_000);
    expect(r.frames.filter((f) => f.type !== "hello" && f.type !== "progress").map((f) => f.type)).toEqual([
      "bootReply",
      "turnReply",
    ]);
    expect(r.frames.find((f) => f.type === "turnReply")).toMatchObject({
      requestId: "first",
      result: { ok: { text: "done: right after boot", stopReason: "end" } },
    });
  });

  it("the build identity covers what the runner imports after boot: the entry names each chunk by content hash", () => {
    const chunks = runnerBuildFiles().slice(1);
    expect(chunks.length).toBeGreaterThan(1);
    // A chunk's name carries the hash of its content and of every chunk it imports, so a change in any of
    // them changes the entry's bytes and with them its digest.
    for (const chunk of chunks) expect(basename(chunk)).toMatch(/^[\w-]+-[A-Z0-9]{8}\.js$/);
  });
});
