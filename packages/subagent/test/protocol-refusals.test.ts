import { bootFrameSchema, errorToRemote, isBootFrameCandidate, parseBootFrame } from "@crw/subagent";
import { describe, expect, it } from "vitest";

/**
 * What the runner's own boot frame validator says when it refuses a frame (the line it logs), and the edges
 * of what it accepts. The property tests in bootFrame.test.ts hold its verdicts to the schema's; these hold
 * the refusal text to what names the wrong field, its path and what was found there.
 */
const valid = {
  type: "boot",
  requestId: "boot-1",
  runnerId: "r",
  buildId: "crw-runner-0123",
  retryPolicy: { revision: 1, maxRetries: 0, initialDelayMs: 0, multiplier: 1 },
  catalog: { revision: 1, public: [{ id: "m", provider: "p" }], accounts: { alice: [] } },
  heartbeatIntervalMs: 5_000,
};
const policy = valid.retryPolicy;
const catalog = valid.catalog;

function refusal(raw: unknown): string {
  const r = parseBootFrame(raw);
  return r.ok ? "accepted" : r.issues;
}

/** Accepted by both the runner's validator and the schema, with the same parsed frame. */
function acceptedAsSchema(raw: unknown) {
  const r = parseBootFrame(raw);
  expect(r.ok, r.ok ? "" : r.issues).toBe(true);
  const schema = bootFrameSchema.parse(raw);
  if (r.ok) expect(r.frame).toStrictEqual(schema);
  return r.ok ? r.frame : undefined;
}

describe("a refused boot frame names what it found", () => {
  it("the kind of a wrong value: null, array, NaN, infinities, undefined, boolean, number, object", () => {
    expect(refusal({ ...valid, requestId: null })).toBe("requestId: expected a string, got null");
    expect(refusal({ ...valid, requestId: ["a"] })).toBe("requestId: expected a string, got array");
    expect(refusal({ ...valid, requestId: Number.NaN })).toBe("requestId: expected a string, got NaN");
    expect(refusal({ ...valid, runnerId: Number.POSITIVE_INFINITY })).toBe(
      "runnerId: expected a string, got Infinity",
    );
    expect(refusal({ ...valid, buildId: Number.NEGATIVE_INFINITY })).toBe(
      "buildId: expected a string, got -Infinity",
    );
    expect(refusal({ ...valid, buildId: undefined })).toBe("buildId: expected a string, got undefined");
    expect(refusal({ ...valid, runnerId: true })).toBe("runnerId: expected a string, got boolean");
    expect(refusal({ ...valid, runnerId: 7 })).toBe("runnerId: expected a string, got number");
    expect(refusal({ ...valid, runnerId: {} })).toBe("runnerId: expected a string, got object");
  });

  it("lengths are counted in code points, a lone surrogate as one", () => {
    expect(refusal({ ...valid, buildId: "😀".repeat(257) })).toBe(
      "buildId: expected 1 to 256 characters, got 257",
    );
    expect(refusal({ ...valid, requestId: `${"😀".repeat(64)}${"a".repeat(65)}` })).toBe(
      "requestId: expected 1 to 128 characters, got 129",
    );
    // A low surrogate before a high one is two lone surrogates, not a pair.
    expect(refusal({ ...valid, requestId: `${"\udc00".repeat(65)}${"\ud800".repeat(65)}` })).toBe(
      "requestId: expected 1 to 128 characters, got 130",
    );
    expect(refusal({ ...valid, requestId: `a${"\ud800".repeat(128)}` })).toBe(
      "requestId: expected 1 to 128 characters, got 129",
    );
    expect(refusal({ ...valid, requestId: `${"😀".repeat(127)}\ud800` })).toBe("accepted");
    expect(refusal({ ...valid, requestId: `${"😀".repeat(127)}\ud800\udc00` })).toBe("accepted");
    expect(refusal({ ...valid, requestId: `${"😀".repeat(127)}\udc00\ud800` })).toBe(
      "requestId: expected 1 to 128 characters, got 129",
    );
  });

  it("numbers: not finite, not a safe integer, out of range, each with the value found", () => {
    expect(refusal({ ...valid, retryPolicy: { ...policy, multiplier: "2" } })).toBe(
      "retryPolicy.multiplier: expected a finite number, got string",
    );
    expect(refusal({ ...valid, retryPolicy: { ...policy, multiplier: Number.NaN } })).toBe(
      "retryPolicy.multiplier: expected a finite number, got NaN",
    );
    expect(refusal({ ...valid, retryPolicy: { ...policy, maxRetries: 1.5 } })).toBe(
      "retryPolicy.maxRetries: expected a safe integer, got 1.5",
    );
    expect(refusal({ ...valid, retryPolicy: { ...policy, revision: 2 ** 53 } })).toBe(
      "retryPolicy.revision: expected a safe integer, got 9007199254740992",
    );
    expect(refusal({ ...valid, retryPolicy: { ...policy, multiplier: 0.5 } })).toBe(
      "retryPolicy.multiplier: expected 1 to 100, got 0.5",
    );
    expect(refusal({ ...valid, retryPolicy: { ...policy, revision: -1 } })).toBe(
      "retryPolicy.revision: expected 0 to 9007199254740991, got -1",
    );
    expect(refusal({ ...valid, heartbeatIntervalMs: 9 })).toBe(
      "heartbeatIntervalMs: expected 10 to 600000, got 9",
    );
    // The bounds themselves are inside.
    acceptedAsSchema({ ...valid, heartbeatIntervalMs: 10 });
    acceptedAsSchema({ ...valid, heartbeatIntervalMs: 600_000 });
    acceptedAsSchema({ ...valid, retryPolicy: { ...policy, multiplier: 100, maxRetries: 100 } });
    acceptedAsSchema({ ...valid, retryPolicy: { ...policy, initialDelayMs: 60_000, multiplier: 1.5 } });
  });

  it("the frame's type, a missing object, an unknown or inherited key", () => {
    expect(refusal({ ...valid, type: "turn" })).toBe('type: expected "boot", got string');
    expect(refusal({ ...valid, retryPolicy: [] })).toBe("retryPolicy: expected an object, got array");
    expect(refusal({ ...valid, catalog: null })).toBe("catalog: expected an object, got null");
    expect(refusal({ ...valid, retryPolicy: { ...policy, extra: 1 } })).toBe(
      'retryPolicy: unrecognized key "extra"',
    );
    expect(refusal(Object.assign(Object.create({ inherited: 1 }), valid))).toBe(
      '<frame>: unrecognized key "inherited"',
    );
  });

  it("arrays: not an array, too many entries, the index of a wrong entry", () => {
    expect(refusal({ ...valid, catalog: { ...catalog, public: {} } })).toBe(
      "catalog.public: expected an array, got object",
    );
    expect(
      refusal({ ...valid, catalog: { ...catalog, public: Array(4097).fill({ id: "m", provider: "p" }) } }),
    ).toBe("catalog.public: expected at most 4096 entries, got 4097");
    expect(
      refusal({ ...valid, catalog: { ...catalog, public: [{ id: "m", provider: "p" }, { id: "m" }] } }),
    ).toBe("catalog.public.1.provider: expected a string, got undefined");
  });

  it("records: not a plain object, a bad key (string or symbol), a wrong entry under its key", () => {
    expect(refusal({ ...valid, catalog: { ...catalog, accounts: [] } })).toBe(
      "catalog.accounts: expected a record, got array",
    );
    expect(refusal({ ...valid, catalog: { ...catalog, accounts: new Map() } })).toBe(
      "catalog.accounts: expected a record, got object",
    );
    expect(refusal({ ...valid, catalog: { ...catalog, accounts: { "": [] } } })).toBe(
      "catalog.accounts: invalid key : expected 1 to 128 characters",
    );
    expect(refusal({ ...valid, catalog: { ...catalog, accounts: { [Symbol("k")]: [] } } })).toBe(
      "catalog.accounts: invalid key Symbol(k): expected 1 to 128 characters",
    );
    expect(refusal({ ...valid, agent: { baseUrls: { other: "https://x.test" } } })).toBe(
      "agent.baseUrls: invalid key other: expected openai-responses | openai-completions | anthropic-messages",
    );
    expect(refusal({ ...valid, agent: { scripts: { "": [] } } })).toBe(
      "agent.scripts: invalid key : expected 1 to 200 characters",
    );
    expect(refusal({ ...valid, catalog: { ...catalog, accounts: { bob: "none" } } })).toBe(
      "catalog.accounts.bob: expected an array, got string",
    );
    expect(refusal({ ...valid, agent: { scripts: { s: [5] } } })).toBe(
      "agent.scripts.s.0: expected a record, got number",
    );
  });

  it("URLs: a string, absolute, and at most 2048 characters once tabs and line breaks are dropped", () => {
    expect(refusal({ ...valid, agent: { baseUrls: { "openai-responses": 5 } } })).toBe(
      "agent.baseUrls.openai-responses: expected a string, got number",
    );
    expect(refusal({ ...valid, agent: { baseUrls: { "openai-responses": "/v1" } } })).toBe(
      "agent.baseUrls.openai-responses: expected an absolute URL",
    );
    const long = `https://x.test/${"a".repeat(2034)}`;
    expect(long).toHaveLength(2049);
    expect(refusal({ ...valid, agent: { baseUrls: { "anthropic-messages": long } } })).toBe(
      "agent.baseUrls.anthropic-messages: expected 0 to 2048 characters, got 2049",
    );
    const kept = acceptedAsSchema({
      ...valid,
      agent: { baseUrls: { "openai-completions": ` \thttps://x.test/\r\n${"a".repeat(2030)}\t ` } },
    });
    expect(kept?.agent?.baseUrls?.["openai-completions"]).toBe(`https://x.test/${"a".repeat(2030)}`);
  });

  it("at most five issues are told, each with its path, separated by semicolons", () => {
    const issues = refusal({
      type: "boot",
      requestId: "",
      runnerId: "",
      buildId: "",
      retryPolicy: 1,
      catalog: 2,
      heartbeatIntervalMs: "x",
      extra: true,
    });
    expect(issues).toBe(
      [
        "requestId: expected 1 to 128 characters, got 0",
        "runnerId: expected 1 to 128 characters, got 0",
        "buildId: expected 1 to 256 characters, got 0",
        "retryPolicy: expected an object, got number",
        "catalog: expected an object, got number",
      ].join("; "),
    );
    expect(refusal(null)).toBe("<frame>: expected an object, got null");
  });
});

describe("what the boot frame validator accepts", () => {
  it("records with no prototype or a foreign-realm-like constructor field are plain records", () => {
    const accounts = Object.assign(Object.create(null), { carol: [{ id: "m", provider: "p" }] });
    const frame = acceptedAsSchema({ ...valid, catalog: { ...catalog, accounts } });
    expect(frame?.catalog.accounts).toEqual({ carol: [{ id: "m", provider: "p" }] });
    // An own `constructor` entry that is not a function is an ordinary key of a script step.
    const step = acceptedAsSchema({
      ...valid,
      agent: { scripts: { s: [{ constructor: 5, kind: "text" }] } },
    });
    expect(step?.agent?.scripts?.s).toEqual([{ constructor: 5, kind: "text" }]);
    class Step {
      kind = "text";
    }
    expect(refusal({ ...valid, agent: { scripts: { s: [new Step()] } } })).toBe(
      "agent.scripts.s.0: expected a record, got object",
    );
  });

  it("a record's __proto__ entry and its hidden (non-enumerable) entries are never copied", () => {
    const accounts = JSON.parse('{"__proto__": [{"id": "x", "provider": "y"}], "dave": []}');
    Object.defineProperty(accounts, "hidden", { value: "not a list", enumerable: false });
    const frame = acceptedAsSchema({ ...valid, catalog: { ...catalog, accounts } });
    expect(Object.getPrototypeOf(frame?.catalog.accounts)).toBe(Object.prototype);
    expect(Reflect.ownKeys(frame?.catalog.accounts ?? {})).toEqual(["dave"]);
  });

  it("an optional field present as undefined stays present; an absent one stays absent", () => {
    const withUndefined = acceptedAsSchema({ ...valid, agent: { baseUrls: undefined } });
    expect(Object.keys(withUndefined?.agent ?? {})).toEqual(["baseUrls"]);
    const absent = acceptedAsSchema(valid);
    expect("agent" in (absent ?? {})).toBe(false);
  });

  it("the frame and its retry policy are frozen; the catalog is not", () => {
    const frame = acceptedAsSchema(valid);
    expect(Object.isFrozen(frame)).toBe(true);
    expect(Object.isFrozen(frame?.retryPolicy)).toBe(true);
    expect(Object.isFrozen(frame?.catalog)).toBe(false);
  });

  it("only an object whose type is boot is a boot frame candidate", () => {
    expect(isBootFrameCandidate(valid)).toBe(true);
    expect(isBootFrameCandidate({ type: "boot" })).toBe(true);
    expect(isBootFrameCandidate({ type: "turn" })).toBe(false);
    expect(isBootFrameCandidate(["boot"])).toBe(false);
    expect(isBootFrameCandidate(null)).toBe(false);
    expect(isBootFrameCandidate("boot")).toBe(false);
  });
});

describe("an error crossing the runner boundary", () => {
  it("keeps its name, message and code, bounded", () => {
    const e = Object.assign(new Error("m".repeat(20_000)), { code: "c".repeat(200) });
    e.name = "N".repeat(200);
    const remote = errorToRemote(e);
    expect(remote.name).toBe("N".repeat(128));
    expect(remote.message).toBe("m".repeat(16_384));
    expect(remote.code).toBe("c".repeat(128));
  });

  it("an empty name becomes Error; a missing, empty or non-string code becomes internal", () => {
    const nameless = new Error("x");
    nameless.name = "";
    expect(errorToRemote(nameless)).toEqual({ name: "Error", message: "x", code: "internal" });
    expect(errorToRemote(Object.assign(new Error("y"), { code: "" })).code).toBe("internal");
    expect(errorToRemote(Object.assign(new Error("y"), { code: 42 })).code).toBe("internal");
    expect(errorToRemote(Object.assign(new TypeError("z"), { code: "E_X" }))).toEqual({
      name: "TypeError",
      message: "z",
      code: "E_X",
    });
  });
});
