import { randomUUID } from "node:crypto";
import { parseWorkflowDefinition } from "@crw/plugin-subagent";
import fc from "fast-check";
import { type Account, type FuzzFrame, world } from "./fuzzLanes.js";

/**
 * The fuzz's frames: ids of every JSON-RPC shape (unique per run), methods real and not, params arbitrary
 * or near each method's valid shape, and frames that are no request at all.
 */

let counter = 0;
/** A unique id in one of the shapes JSON-RPC allows (numbers of every kind, strings of any text). */
const idArb = fc.oneof(
  fc.constant(0).map(() => ++counter),
  fc.constant(0).map(() => -++counter),
  fc.constant(0).map(() => ++counter + 0.5),
  fc.constant(0).map(() => ++counter * 2 ** 40),
  fc.string({ unit: "binary", maxLength: 12 }).map((s) => `${++counter}${s}`),
  fc.string({ maxLength: 8 }).map((s) => `${s}\u0000${++counter}`),
  fc.constant(0).map(() => `${"i".repeat(2_000)}${++counter}`),
);
const badIdArb = fc.oneof(
  fc.constantFrom(null, true, false, [], [1], {}, { a: 1 }),
  fc.jsonValue({ maxDepth: 2 }).filter((v) => typeof v !== "string" && typeof v !== "number"),
);
const hostileString = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 16 }) },
  fc.string({ unit: "binary", maxLength: 16 }),
  fc.constantFrom(
    "",
    "\u0000",
    "a\u0000b",
    "\uD800",
    "\u202E",
    "%s%n",
    "'; drop table sessions; --",
    "../../etc/passwd",
  ),
  fc.integer({ min: 200, max: 5_000 }).map((n) => "x".repeat(n)),
  fc.constant(0).map(() => "y".repeat(70_000)),
);
const wrongValue = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(null, true, -1, 0, 1.5, -0.5, 2 ** 53 + 2, 1e308, -1e308, [], {}, [""], { toString: 1 }),
);
/** The registered names, read once the daemon runs (the generators are built before). */
const realMethod = fc.constant(0).chain(() => fc.constantFrom(...world.methods));
const methodArb = fc.oneof(
  { weight: 6, arbitrary: realMethod },
  fc.constantFrom(
    "",
    "session",
    "session.",
    "Session.create",
    "rpc.discover",
    "daemon.stop",
    "__proto__",
    "constructor",
    "toString",
    "hasOwnProperty",
    "session.create\u0000",
    " daemon.whoami",
  ),
  hostileString,
);
export const deep = (depth: number, leaf: unknown = 1): unknown => {
  let v: unknown = leaf;
  for (let i = 0; i < depth; i++) v = i % 2 ? [v] : { k: v };
  return v;
};
/** The JSON text of `deep(depth)`, built without recursion. */
export const deepText = (depth: number): string => {
  const open: string[] = [];
  const close: string[] = [];
  for (let i = depth - 1; i >= 0; i--) {
    open.push(i % 2 ? "[" : '{"k":');
    close.push(i % 2 ? "]" : "}");
  }
  return `${open.join("")}1${close.reverse().join("")}`;
};
/** Params nested this deep are a known failure (see the regression below): the fuzz stays below it. */
export const SAFE_DEPTH = 1_000;

function uuidPool(account: Account, own: boolean): fc.Arbitrary<string> {
  const mine = account === "other" ? world.ownIds.otherSessions : world.ownIds.adminSessions;
  return fc.oneof(
    fc.constantFrom(...world.ownerIds),
    fc.constant(0).map(() => randomUUID()),
    fc.constantFrom("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"),
    ...(own ? [fc.constantFrom(...mine)] : []),
  );
}
const badUuid = fc.constantFrom(
  "",
  "not-a-uuid",
  "00000000-0000-0000-0000-00000000000",
  "{00000000-0000-4000-8000-000000000000}",
  "00000000-0000-4000-8000-000000000000\u0000",
  "00000000-0000-4000-8000-000000000000'",
);
const invalidDefinitions = [
  "name: c\nnodes:\n  - {id: a, task: t, dependsOn: [b]}\n  - {id: b, task: t, dependsOn: [a]}\n",
  'name: n\nnodes:\n  - {id: a, task: "x\\0y"}\n',
  '{"name":"n","nodes":[{"id":"a","task":"x\\u0000"}]}',
  "name: n\nnodes: []\n",
  "name: n\nnodes:\n  - {id: a, task: t, agentType: __proto__}\n",
  'name: n\nnodes:\n  - {id: a, task: t, tools: {allow: ["shell(\\n)"]}}\n',
  "name: n\nnodes:\n  - {id: a, task: t, outputSchema: {pattern: '(a)\\1'}}\n",
  "name: n\nname: m\nnodes: [{id: a, task: t}]\n",
  `name: n\nnodes:\n${Array.from({ length: 501 }, (_, i) => `  - {id: n${i}, task: t}`).join("\n")}\n`,
  `${"[".repeat(60)}${"]".repeat(60)}`,
];
/** A definition the daemon must refuse (an arbitrary text that happens to parse is swapped for one). */
const definitionArb = fc
  .oneof(
    fc.constantFrom(...invalidDefinitions),
    fc.string({ maxLength: 200 }),
    fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)),
    fc.constantFrom(...invalidDefinitions).map((d) => `${d}\u0000`),
  )
  .map((text) => {
    try {
      parseWorkflowDefinition(text, "yaml");
    } catch {
      return text;
    }
    return invalidDefinitions[0] as string;
  });
const toolEntryArb = fc.oneof(
  fc.constantFrom("read", "shell(git *)", "*", "mcp__*"),
  fc.constantFrom("shell(\n)", "a(b", "", "x".repeat(651), "\u0000", "__proto__"),
  hostileString,
);
const accountRefArb = fc.oneof(
  fc.constantFrom("someone-else", "fuzz-admin", "owner", "nobody"),
  fc.constant(0).map(() => world.who.owner.accountId),
  fc.constant(0).map(() => world.who.other.accountId),
  fc.constant(0).map(() => randomUUID()),
  hostileString,
);
const pathArb = fc.oneof(
  fc.constant(0).map(() => world.projectDir),
  fc.constantFrom(
    "/",
    "/etc",
    "/proc/self/root",
    "/tmp",
    ".",
    "..",
    "/nonexistent/dir",
    "~",
    "relative/dir",
    "/dev/null",
  ),
  hostileString,
);

/** Each method's params as valid fields (`ok`), for the ordinary account or the administrator. */
function shapeOf(method: string, account: Account): Record<string, fc.Arbitrary<unknown>> | undefined {
  const foreign = uuidPool(account, false);
  const any = uuidPool(account, true);
  const model = fc.constantFrom("scripted", "nonexistent-model", "m".repeat(256));
  const cwd = fc.oneof(fc.constantFrom("sub", ".", "/", "..", "../..", "/etc"), pathArb);
  switch (method) {
    case "session.create":
      return { model, cwd };
    case "session.send":
      return { sessionId: foreign, text: fc.constantFrom("hi", "x"), readOnly: fc.boolean() };
    case "session.delegate":
      return {
        sessionId: foreign,
        task: fc.constantFrom("t"),
        background: fc.boolean(),
        model,
        role: fc.constantFrom("reviewer"),
        readOnly: fc.boolean(),
        cwd,
        isolation: fc.constantFrom("none", "worktree"),
      };
    case "session.land":
    case "session.status":
    case "session.forkPrefix":
      return { sessionId: any };
    case "session.read":
      return { sessionId: any, limit: fc.integer({ min: 1, max: 1000 }) };
    case "session.tap":
      return { sessionId: foreign, afterSeq: fc.nat(), untilIdle: fc.boolean() };
    case "workflow.start":
      return {
        definition: definitionArb,
        format: fc.constantFrom("yaml", "json"),
        sessionId: any,
        model,
        cwd,
      };
    case "workflow.status":
    case "workflow.land":
    case "workflow.cancel":
    case "workflow.follow":
      return { workflowId: foreign };
    case "project.add":
      return { path: pathArb, name: fc.constantFrom("fuzz", "p"), account: accountRefArb };
    case "account.create":
      return {
        name: fc
          .string({ minLength: 1, maxLength: 12 })
          .map((s) => `fz${s.replace(/[^A-Za-z0-9._@-]/g, "")}`),
        administrator: fc.boolean(),
        allow: fc.option(fc.array(toolEntryArb, { maxLength: 3 }), { nil: null }),
        deny: fc.array(toolEntryArb, { maxLength: 3 }),
      };
    case "account.grant":
      return {
        account: accountRefArb,
        allow: fc.option(fc.array(toolEntryArb, { maxLength: 3 }), { nil: null }),
        deny: fc.array(toolEntryArb, { maxLength: 3 }),
      };
    case "token.issue":
      return { account: accountRefArb, label: hostileString };
    case "token.list":
      return { account: accountRefArb };
    case "token.revoke":
      return { id: fc.oneof(fc.stringMatching(/^[0-9a-f]{12}$/), hostileString) };
    case "account.list":
    case "project.list":
    case "daemon.health":
    case "daemon.whoami":
      return {};
    default:
      return undefined;
  }
}

/** The members each method's schema requires. */
const REQUIRED: Record<string, string[]> = {
  "session.send": ["sessionId", "text"],
  "session.delegate": ["sessionId", "task"],
  "session.land": ["sessionId"],
  "session.status": ["sessionId"],
  "session.forkPrefix": ["sessionId"],
  "session.read": ["sessionId"],
  "session.tap": ["sessionId"],
  "workflow.start": ["definition"],
  "workflow.status": ["workflowId"],
  "workflow.land": ["workflowId"],
  "workflow.cancel": ["workflowId"],
  "workflow.follow": ["workflowId"],
  "project.add": ["path"],
  "account.create": ["name"],
  "account.grant": ["account"],
  "token.issue": ["account"],
  "token.revoke": ["id"],
};

/**
 * Params near a method's valid shape: its fields valid, except some made wrong (a wrong type, U+0000, an
 * over-long string, a negative or huge number, another account's uuid), an extra key, or anything at all.
 */
function paramsFor(method: string, account: Account): fc.Arbitrary<unknown> {
  const key = `${account} ${method}`;
  let arb = paramsArbs.get(key);
  if (!arb) {
    arb = buildParams(method, account);
    paramsArbs.set(key, arb);
  }
  return arb;
}
/**
 * Each method's params arbitrary, built once: frames choose their method as they are generated, and
 * building one anew per frame (a `stringMatching` among its fields tokenizes fast-check's whole list of
 * dangerous strings each time) cost more than sending the frames. An arbitrary keeps no state: the same
 * one generates the same values from the same seed.
 */
const paramsArbs = new Map<string, fc.Arbitrary<unknown>>();
function buildParams(method: string, account: Account): fc.Arbitrary<unknown> {
  const shape = shapeOf(method, account);
  if (!shape) return fc.oneof(fc.constant({}), wrongValue);
  const keys = Object.keys(shape);
  return fc.oneof(
    {
      weight: 8,
      arbitrary: fc
        .tuple(
          fc.record(shape, { requiredKeys: REQUIRED[method] ?? [] }),
          // most cases keep the valid shape: half change nothing, the rest one or two members
          fc
            .array(
              fc.tuple(
                fc.oneof(
                  fc.constantFrom(...(keys.length ? keys : ["x"])),
                  fc.constantFrom("extra", "__proto__", "sessionid"),
                ),
                fc.oneof(wrongValue, hostileString, badUuid, fc.constantFrom(-1, 2 ** 31, 1e21, 0.5)),
              ),
              { maxLength: 2 },
            )
            .chain((wrong) => fc.boolean().map((keep) => (keep ? [] : wrong))),
        )
        .map(([valid, wrong]) => {
          const out: Record<string, unknown> = { ...valid };
          for (const [k, v] of wrong)
            Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
          return out;
        }),
    },
    { weight: 1, arbitrary: wrongValue },
    {
      weight: 1,
      arbitrary: fc.integer({ min: 10, max: SAFE_DEPTH }).map((d) => ({ [keys[0] ?? "x"]: deep(d) })),
    },
  );
}

export const json = (v: unknown) => JSON.stringify(v) ?? "null";

/** Frames of every kind for `account`; params near each method's shape when `params` is set. */
export function frameArb(account: Account): fc.Arbitrary<FuzzFrame> {
  const request = fc.oneof(realMethod, methodArb).chain((method) =>
    fc
      .record(
        {
          jsonrpc: fc.oneof(
            { weight: 9, arbitrary: fc.constant("2.0") },
            fc.constantFrom("1.0", 2, null, "2.0 "),
          ),
          id: idArb,
          method: fc.oneof({ weight: 9, arbitrary: fc.constant(method) }, wrongValue),
          params: fc.oneof({ weight: 3, arbitrary: paramsFor(method, account) }, wrongValue),
          extra: wrongValue,
        },
        { requiredKeys: ["jsonrpc", "method"] },
      )
      .map((r) => ({ account, text: json(r) })),
  );
  return fc.oneof(
    { weight: 8, arbitrary: request },
    // invalid ids, answered with id null
    {
      weight: 2,
      arbitrary: fc
        .record(
          { jsonrpc: fc.constant("2.0"), id: badIdArb, method: methodArb, params: wrongValue },
          { requiredKeys: ["id"] },
        )
        .map((r) => ({ account, text: json(r) })),
    },
    // any JSON value, any text, any bytes
    { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => ({ account, text: json(v) })) },
    { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 64 }).map((text) => ({ account, text })) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 64 }).map((bytes) => ({ account, bytes })) },
    // deep nesting and long strings, bounded
    {
      weight: 1,
      arbitrary: fc
        .integer({ min: 100, max: 20_000 })
        .map((d) => ({ account, text: `${"[".repeat(d)}${"]".repeat(d)}` })),
    },
    {
      weight: 1,
      arbitrary: fc.tuple(idArb, fc.integer({ min: 1_000, max: 200_000 })).map(([id, n]) => ({
        account,
        text: json({ jsonrpc: "2.0", id, method: "daemon.whoami", params: { pad: "p".repeat(n) } }),
      })),
    },
    // text that is almost a request: duplicate keys, an overflowing id, odd whitespace, a BOM
    {
      weight: 1,
      arbitrary: fc
        .tuple(idArb, realMethod)
        .chain(([id, method]) =>
          fc.constantFrom(
            `{"jsonrpc":"2.0","id":${json(id)},"id":${json(id)},"method":${json(method)}}`,
            `{"jsonrpc":"2.0","id":1e400,"method":"daemon.whoami"}`,
            ` \n\t{"jsonrpc":"2.0","id":${json(id)},"method":"daemon.whoami"}\n`,
            `\uFEFF{"jsonrpc":"2.0","id":${json(id)},"method":"daemon.whoami"}`,
            `{"jsonrpc":"2.0","id":${json(id)},"method":"daemon.whoami",}`,
            `{"jsonrpc":"2.0","method":"daemon.whoami","id":${json(id)},"__proto__":{"id":null}}`,
          ),
        )
        .map((text) => ({ account, text })),
    },
  );
}

/** Only params near each method's shape: the per-method cases. */
export function paramsFrameArb(account: Account): fc.Arbitrary<FuzzFrame> {
  return realMethod.chain((method) =>
    fc.tuple(idArb, paramsFor(method, account)).map(([id, params]) => ({
      account,
      text: json({ jsonrpc: "2.0", id, method, params }),
    })),
  );
}

export const mixed = (arb: (a: Account) => fc.Arbitrary<FuzzFrame>) =>
  fc.oneof({ weight: 3, arbitrary: arb("other") }, { weight: 1, arbitrary: arb("admin") });
