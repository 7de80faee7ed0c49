import { bootFrameSchema, isBootFrameCandidate, parseBootFrame, parseInputFrame } from "@crw/subagent";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { intNear, mostly, recordOf, strangeValue, stringsNear, textNear } from "./support/arbitraries.js";

/**
 * The runner reads its boot frame with a small validator of its own (protocol/bootFrame.ts) so that its boot
 * does not load the schema library. The schema stays the contract: for every frame, valid or not, the two
 * must give the same verdict and, when they accept, the same parsed frame.
 */

/** Same verdict, same parsed value (frozen where the schema freezes), and the same verdict through the runner's full parser. */
function agrees(raw: unknown): boolean {
  const schema = bootFrameSchema.safeParse(raw);
  const own = parseBootFrame(raw);
  expect(own.ok, JSON.stringify(own.ok ? "" : own.issues)).toBe(schema.success);
  if (own.ok && schema.success) {
    expect(own.frame).toStrictEqual(schema.data);
    expect(Object.isFrozen(own.frame)).toBe(true);
    expect(Object.isFrozen(own.frame.retryPolicy)).toBe(true);
  }
  if (isBootFrameCandidate(raw)) expect(parseInputFrame(raw).ok).toBe(schema.success);
  else expect(schema.success).toBe(false);
  return schema.success;
}

const valid = {
  type: "boot",
  requestId: "boot-1",
  runnerId: "r",
  buildId: "crw-runner-0123",
  retryPolicy: { revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 },
  catalog: { revision: 1, public: [{ id: "m", provider: "p" }], accounts: { alice: [] } },
  heartbeatIntervalMs: 5_000,
};

const model = mostly(
  fc.record({ id: textNear(1, 256), provider: textNear(1, 128) }),
  fc.oneof(
    fc.record({ id: fc.constant("m"), provider: fc.constant("p"), extra: fc.anything() }),
    strangeValue,
  ),
);

const agentApi = fc.constantFrom("openai-responses", "openai-completions", "anthropic-messages");
const urlText = mostly(
  fc.webUrl(),
  fc.constantFrom(
    " https://api.example.test/v1 ",
    "https://exa\nmple.test",
    "\thttp://x.test\t",
    "http:example.test",
    "not a url",
    "mailto:someone@example.test",
    `https://example.test/${"a".repeat(2040)}`,
    `  https://example.test/${"a".repeat(2025)}  `,
    "",
  ),
);

const agentOptions = fc.record(
  {
    baseUrls: mostly(recordOf(agentApi, urlText), fc.oneof(recordOf(fc.string(), urlText), strangeValue)),
    apiKeyEnv: mostly(recordOf(agentApi, textNear(1, 256)), strangeValue),
    scripts: mostly(
      recordOf(
        stringsNear(1, 200),
        fc.array(mostly(fc.object({ maxDepth: 1 }), strangeValue), { maxLength: 3 }),
      ),
      strangeValue,
    ),
  },
  { requiredKeys: [] },
);

/** Any subset of a boot frame's fields, each mostly valid, with an occasional unknown key. */
const bootFrame = fc.record(
  {
    type: mostly(fc.constant("boot"), fc.constantFrom("Boot", "turn", undefined)),
    requestId: textNear(1, 128),
    runnerId: textNear(1, 128),
    buildId: textNear(1, 256),
    retryPolicy: mostly(
      fc.record({
        revision: intNear(0),
        maxRetries: intNear(0, 100),
        initialDelayMs: intNear(0, 60_000),
        multiplier: mostly(fc.double({ min: 1, max: 100, noNaN: true }), fc.double()),
      }),
      strangeValue,
    ),
    catalog: mostly(
      fc.record({
        revision: intNear(0),
        public: mostly(fc.array(model, { maxLength: 3 }), strangeValue),
        accounts: mostly(recordOf(stringsNear(1, 128), fc.array(model, { maxLength: 2 })), strangeValue),
      }),
      strangeValue,
    ),
    heartbeatIntervalMs: intNear(10, 600_000),
    agent: mostly(agentOptions, strangeValue),
    extra: fc.anything({ maxDepth: 1 }),
  },
  { requiredKeys: [] },
);

/** A valid frame with generated fields in place of its own, now and then one key dropped or one added. */
const nearValidFrame = fc
  .record({
    fields: bootFrame,
    drop: fc.oneof({ arbitrary: fc.constant(undefined), weight: 8 }, fc.constantFrom(...Object.keys(valid))),
    extra: fc.oneof({ arbitrary: fc.constant(false), weight: 8 }, fc.constant(true)),
  })
  .map(({ fields, drop, extra }) => {
    const { extra: extraValue, ...rest } = fields;
    const out: Record<string, unknown> = { ...valid, ...rest };
    if (drop) delete out[drop];
    if (extra) out.extra = extraValue;
    return out;
  });

describe("the runner's boot frame validator gives the schema's verdicts", () => {
  it("same verdict and same parsed frame for generated frames, valid and not (property)", () => {
    let accepted = 0;
    let refused = 0;
    fc.assert(
      fc.property(fc.oneof(nearValidFrame, bootFrame), (raw) => {
        if (agrees(raw)) accepted++;
        else refused++;
      }),
      { numRuns: 2_000 },
    );
    // Both verdicts must be well represented, or the property proves little.
    expect(accepted).toBeGreaterThan(200);
    expect(refused).toBeGreaterThan(200);
  });

  it("the same verdicts in the form a frame crosses the channel (JSON), own __proto__ keys included", () => {
    fc.assert(
      fc.property(fc.oneof(nearValidFrame, bootFrame), (raw) => {
        const wire = JSON.stringify(raw);
        agrees(wire === undefined ? null : JSON.parse(wire));
      }),
      { numRuns: 500 },
    );
    for (const text of [
      `{"accounts":{"__proto__":[{"id":"m","provider":"p"}]}}`,
      `{"accounts":{"__proto__":"not a list"}}`,
      `{"accounts":{},"__proto__":{"x":1}}`,
    ]) {
      const catalog = { revision: 1, public: [], ...JSON.parse(text) };
      agrees({ ...valid, catalog });
      agrees({ ...valid, agent: { scripts: JSON.parse(text).accounts } });
    }
  });

  it("values that are not frames at all", () => {
    fc.assert(
      fc.property(
        fc.anything({ withNullPrototype: true, withObjectString: true }),
        (raw) => void agrees(raw),
      ),
    );
    for (const raw of [
      null,
      undefined,
      "boot",
      ["boot"],
      { type: "boot" },
      Object.create({ type: "boot" }),
    ]) {
      expect(agrees(raw)).toBe(false);
    }
  });

  it("edges each schema rule draws, one at a time", () => {
    const cases: unknown[] = [
      valid,
      { ...valid, heartbeatIntervalMs: 9 },
      { ...valid, heartbeatIntervalMs: 600_001 },
      { ...valid, heartbeatIntervalMs: 10.5 },
      { ...valid, retryPolicy: { ...valid.retryPolicy, revision: 2 ** 53 } },
      { ...valid, retryPolicy: { ...valid.retryPolicy, multiplier: 100.0001 } },
      { ...valid, retryPolicy: { ...valid.retryPolicy, initialDelayMs: 60_001 } },
      { ...valid, requestId: "😀".repeat(128) },
      { ...valid, requestId: "😀".repeat(129) },
      { ...valid, requestId: "\ud800".repeat(128) },
      { ...valid, buildId: "" },
      { ...valid, catalog: { ...valid.catalog, public: Array(4096).fill({ id: "m", provider: "p" }) } },
      { ...valid, catalog: { ...valid.catalog, public: Array(4097).fill({ id: "m", provider: "p" }) } },
      { ...valid, catalog: { ...valid.catalog, accounts: { ["a".repeat(129)]: [] } } },
      { ...valid, catalog: { ...valid.catalog, accounts: new Map() } },
      { ...valid, catalog: { ...valid.catalog, accounts: { [Symbol("k")]: [] } } },
      { ...valid, agent: undefined },
      { ...valid, agent: {} },
      { ...valid, agent: { baseUrls: { "openai-responses": " https://x.test/\tv1 " } } },
      { ...valid, agent: { baseUrls: { other: "https://x.test" } } },
      { ...valid, agent: { baseUrls: undefined, apiKeyEnv: { "anthropic-messages": "KEY" } } },
      { ...valid, agent: { scripts: { s: Array(10_000).fill({}) } } },
      { ...valid, agent: { scripts: { s: Array(10_001).fill({}) } } },
      { ...valid, agent: { scripts: { s: [{ a: undefined, "": 1 }] } } },
      { ...valid, agent: { scripts: { s: [new Date()] } } },
      { ...valid, unknown: undefined },
      Object.assign(Object.create({ inherited: 1 }), valid),
    ];
    expect(cases.map(agrees)).toEqual(cases.map((c) => bootFrameSchema.safeParse(c).success));
  });

  it("a refused boot frame says what was wrong, at which path", () => {
    const refused = (raw: unknown) => {
      const r = parseBootFrame(raw);
      return r.ok ? "accepted" : r.issues;
    };
    expect(refused({ ...valid, retryPolicy: { ...valid.retryPolicy, maxRetries: 101 } })).toMatch(
      /^retryPolicy\.maxRetries: expected 0 to 100, got 101$/,
    );
    expect(refused({ ...valid, extra: 1 })).toBe('<frame>: unrecognized key "extra"');
    expect(refused({ ...valid, catalog: undefined })).toBe("catalog: expected an object, got undefined");
    expect(refused({ ...valid, requestId: "" })).toBe("requestId: expected 1 to 128 characters, got 0");
    expect(refused({ ...valid, agent: { baseUrls: { "openai-responses": "nope" } } })).toBe(
      "agent.baseUrls.openai-responses: expected an absolute URL",
    );
    expect(refused("boot")).toBe("<frame>: expected an object, got string");
  });
});
