import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { RpcConnection, type RpcEvent } from "../../src/host/rpcConnection.js";
import { splitWords } from "../../src/host/transport/fromSpec.js";
import type { HostTransport, TransportHandlers } from "../../src/host/transport/transport.js";
import { HostSpecError, hostTransportFromSpec, readRolloutTokenCount } from "../../src/index.js";

const dir = mkdtempSync(join(tmpdir(), "crw-host-prop-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const usage = fc.record({
  input_tokens: fc.nat(1_000_000),
  cached_input_tokens: fc.nat(1_000_000),
  output_tokens: fc.nat(1_000_000),
  reasoning_output_tokens: fc.nat(1_000_000),
  total_tokens: fc.nat(2_000_000),
});

const line = fc.oneof(
  usage.map((u) => ({ kind: "count" as const, usage: u })),
  fc.string({ unit: "binary", maxLength: 300 }).map((text) => ({ kind: "text" as const, text })),
  fc.constant({ kind: "null_info" as const }),
);

function render(l: { kind: string; usage?: Record<string, number>; text?: string }): string {
  if (l.kind === "count") {
    return JSON.stringify({
      timestamp: "t",
      type: "event_msg",
      payload: { type: "token_count", info: { total_token_usage: l.usage, last_token_usage: l.usage } },
    });
  }
  if (l.kind === "null_info")
    return JSON.stringify({ type: "event_msg", payload: { type: "token_count", info: null } });
  return JSON.stringify({ type: "response_item", payload: { type: "message", text: l.text } });
}

/** The obvious reader: every line, the last one that is a token_count with info. */
function naive(text: string) {
  let last: Record<string, number> | undefined;
  for (const l of text.split("\n")) {
    try {
      const v = JSON.parse(l);
      if (v?.type === "event_msg" && v.payload?.type === "token_count" && v.payload.info) {
        last = v.payload.info.total_token_usage;
      }
    } catch {}
  }
  return (
    last && {
      input: last.input_tokens,
      cached_input: last.cached_input_tokens,
      output: last.output_tokens,
      reasoning_output: last.reasoning_output_tokens,
      total: last.total_tokens,
    }
  );
}

describe("the rollout's last token_count", () => {
  it("reading backwards in chunks of any size finds what reading every line finds, torn tail or not", async () => {
    let n = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.array(line, { maxLength: 40 }),
        fc.integer({ min: 1, max: 600 }),
        fc.option(fc.string({ maxLength: 80 }), { nil: undefined }),
        async (lines, chunkSize, tornTail) => {
          const text =
            lines.map((l) => `${render(l)}\n`).join("") +
            (tornTail !== undefined
              ? `{"type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{${tornTail}`
              : "");
          const path = join(dir, `r${n++}.jsonl`);
          writeFileSync(path, text);
          expect(await readRolloutTokenCount(path, { chunkSize })).toEqual(naive(text));
        },
      ),
      { numRuns: 150 },
    );
  });

  it("a line longer than several chunks is still read whole", async () => {
    const path = join(dir, "long.jsonl");
    const big = render({ kind: "text", text: "é".repeat(200_000) });
    const count = render({
      kind: "count",
      usage: {
        input_tokens: 5,
        cached_input_tokens: 1,
        output_tokens: 2,
        reasoning_output_tokens: 0,
        total_tokens: 7,
      },
    });
    writeFileSync(path, `${count}\n${big}\n`);
    expect(await readRolloutTokenCount(path)).toEqual({
      input: 5,
      cached_input: 1,
      output: 2,
      reasoning_output: 0,
      total: 7,
    });
  });
});

describe("the host command line", () => {
  const word = fc.string({ minLength: 1, maxLength: 12 }).filter((w) => !/["']/.test(w));
  it("words quoted where they hold blanks split back into the same words", () => {
    fc.assert(
      fc.property(fc.array(word, { minLength: 1, maxLength: 8 }), (words) => {
        const line = words.map((w) => (/\s/.test(w) || w === "" ? `"${w}"` : w)).join(" ");
        expect(splitWords(line)).toEqual(words);
      }),
    );
  });

  it("the default host finds codex: CRW_CODEX_BIN, else PATH, else the installed package", () => {
    const bin = join(dir, "bin");
    mkdirSync(bin, { recursive: true });
    writeFileSync(join(bin, "codex"), "#!/bin/sh\n", { mode: 0o755 });
    expect(hostTransportFromSpec("", { PATH: `/nonexistent:${bin}` }).describe).toBe(
      `${join(bin, "codex")} app-server proxy`,
    );
    // A login shell's PATH without codex: the @openai/codex package of this install, run with this node.
    expect(hostTransportFromSpec("", { PATH: "/nonexistent" }).describe).toMatch(
      /^\S+node \S+@openai\/codex\/bin\/codex\.js app-server proxy$/,
    );
  });

  it("an unterminated quote and an empty socket path are input errors", () => {
    expect(() => splitWords('codex "app-server')).toThrow(HostSpecError);
    expect(() => hostTransportFromSpec("unix://")).toThrow(HostSpecError);
    expect(() => hostTransportFromSpec("ws://exa mple")).toThrow(HostSpecError);
  });

  it("chooses the framing from the command: the proxy speaks WebSocket, app-server on stdio lines", () => {
    expect(hostTransportFromSpec("codex app-server proxy --sock /x").describe).toBe(
      "codex app-server proxy --sock /x",
    );
    expect(hostTransportFromSpec("", { CRW_CODEX_BIN: "/opt/codex" }).describe).toBe(
      "/opt/codex app-server proxy",
    );
    expect(hostTransportFromSpec("ws://127.0.0.1:9").describe).toBe("ws://127.0.0.1:9");
    expect(hostTransportFromSpec("unix:///tmp/s.sock").describe).toBe("unix:///tmp/s.sock");
  });
});

/** A transport whose far side is the test. */
function loopTransport() {
  let handlers: TransportHandlers | null = null;
  const sent: string[] = [];
  const transport: HostTransport = {
    describe: "loop",
    async connect(h) {
      handlers = h;
      return { send: (t) => sent.push(t), close: () => h.onClose("closed") };
    },
  };
  return { transport, sent, deliver: (text: string) => handlers?.onMessage(text) };
}

describe("JSON-RPC frames from the host", () => {
  it("any frame is a notification, an answer or a reported bad frame; it never breaks a pending request", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.oneof(
            fc.string({ unit: "binary", maxLength: 200 }),
            fc.json(),
            fc.record({ method: fc.string(), params: fc.anything() }).map((v) => JSON.stringify(v)),
            fc
              .record({ id: fc.oneof(fc.string(), fc.integer()), result: fc.anything() })
              .map((v) => JSON.stringify(v)),
          ),
          { maxLength: 30 },
        ),
        async (frames) => {
          const loop = loopTransport();
          const events: RpcEvent[] = [];
          const rpc = await RpcConnection.open(loop.transport, 1000, (e) => events.push(e));
          const pending = rpc.request("thread/read", {}, 5_000);
          const id = (JSON.parse(loop.sent[0] ?? "{}") as { id: number }).id;
          for (const frame of frames) {
            if (frame.includes(`"id":${id}`)) continue; // the test answers its own request below
            expect(() => loop.deliver(frame)).not.toThrow();
          }
          loop.deliver(JSON.stringify({ id, result: { fine: true } }));
          await expect(pending).resolves.toEqual({ fine: true });
          rpc.close();
        },
      ),
      { numRuns: 100 },
    );
  });

  it("a request from the server is refused with an error, never left waiting", async () => {
    const loop = loopTransport();
    const events: RpcEvent[] = [];
    await RpcConnection.open(loop.transport, 1000, (e) => events.push(e));
    loop.deliver(JSON.stringify({ id: 7, method: "item/commandExecution/requestApproval", params: {} }));
    expect(JSON.parse(loop.sent.at(-1) ?? "{}")).toMatchObject({ id: 7, error: { code: -32601 } });
    expect(events).toContainEqual({
      type: "server_request_refused",
      method: "item/commandExecution/requestApproval",
    });
  });
});
