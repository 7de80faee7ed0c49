import WebSocket from "ws";

/**
 * The fuzz's connections and the contract every reply is judged by (see fuzz-frames.test.ts): frames are
 * sorted by what the server must answer (one reply with their id, one with id null, or at most one for a
 * notification), sent over several connections with at most WINDOW in flight each, and every reply checked.
 */

export type Account = "other" | "admin";

/** What the fuzz knows of the daemon under test; filled by the suite before any frame is sent. */
export const world = {
  url: "",
  methods: [] as string[],
  who: {} as Record<"owner" | Account, { accountId: string; token: string }>,
  /** The owner's session and workflow ids: no reply to another account may quote one it was not sent. */
  ownerIds: new Set<string>(),
  ownIds: { otherSessions: [] as string[], adminSessions: [] as string[] },
  projectDir: "",
};

/** Frames per fast-check run, pipelined over the connections. */
export const BATCH = 200;
/** Requests in flight per connection; the server refuses past 32. */
export const WINDOW = 24;
const REPLY_TIMEOUT_MS = 15_000;

export type Frame = Record<string, unknown>;
export interface Reply {
  readonly text: string;
  readonly frame: Frame;
}

/** A raw connection that keeps every reply, by id key (`typeof:JSON`), and those with id null in order. */
export class Lane {
  readonly byKey = new Map<string, Reply[]>();
  readonly nullReplies: Reply[] = [];
  readonly waiters = new Map<string, () => void>();
  onNull: (() => void) | undefined;
  closed: { code: number; reason: string } | undefined;

  private constructor(
    readonly ws: WebSocket,
    readonly account: Account,
  ) {
    ws.on("message", (data) => {
      const text = data.toString();
      const frame = JSON.parse(text) as Frame;
      if (typeof frame.method === "string" && !("id" in frame)) return; // a server notification
      const reply = { text, frame };
      if (frame.id === null || frame.id === undefined) {
        this.nullReplies.push(reply);
        this.onNull?.();
        return;
      }
      const key = keyOf(frame.id);
      this.byKey.set(key, [...(this.byKey.get(key) ?? []), reply]);
      this.waiters.get(key)?.();
    });
    ws.on("close", (code, reason) => {
      this.closed = { code, reason: reason.toString() };
    });
  }

  static async open(account: Account): Promise<Lane> {
    const ws = new WebSocket(`${world.url.replace("http", "ws")}/rpc`, {
      headers: { authorization: `Bearer ${world.who[account].token}` },
    });
    await new Promise((resolve, reject) => {
      ws.once("open", resolve);
      ws.once("error", reject);
    });
    return new Lane(ws, account);
  }

  close(): void {
    this.ws.close();
  }
}

export const keyOf = (id: unknown) => `${typeof id}:${JSON.stringify(id)}`;
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---- what a frame is, and what its reply must be --------------------------------------------------------

/** One generated frame: its text (or bytes, sent binary), and for whom. */
export interface FuzzFrame {
  readonly account: Account;
  readonly text?: string;
  readonly bytes?: Uint8Array;
}

type Expectation =
  | { kind: "keyed"; key: string }
  | { kind: "null" }
  | { kind: "notification"; method: string };

/** What the server must answer, decided as the server decodes the frame (V8's JSON.parse either way). */
function expectationOf(f: FuzzFrame): Expectation {
  if (f.bytes) return { kind: "null" };
  let value: unknown;
  try {
    value = JSON.parse(f.text as string);
  } catch {
    return { kind: "null" };
  }
  const req = value as { jsonrpc?: unknown; method?: unknown; id?: unknown };
  const isObject = typeof value === "object" && value !== null;
  if (isObject && "id" in req) {
    if (typeof req.id !== "string" && typeof req.id !== "number") return { kind: "null" };
    // The reply's id is the id as JSON writes it back: a number beyond double range comes back null.
    const echoed = (JSON.parse(JSON.stringify({ id: req.id })) as { id: unknown }).id;
    return echoed === null ? { kind: "null" } : { kind: "keyed", key: keyOf(echoed) };
  }
  if (!isObject || req.jsonrpc !== "2.0" || typeof req.method !== "string") return { kind: "null" };
  return { kind: "notification", method: req.method };
}

const SQLSTATE = /^[0-9A-Z]{5}$/;
const UUID_G = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi;

/** Why a reply breaks the API's contract, or undefined. */
export function replyProblem(
  reply: Reply,
  sentText: string | undefined,
  account: Account,
): string | undefined {
  const f = reply.frame;
  if (f.jsonrpc !== "2.0") return "reply without jsonrpc 2.0";
  const hasResult = "result" in f;
  const hasError = "error" in f;
  if (hasResult === hasError) return "reply has neither or both of result and error";
  if (hasError) {
    const e = f.error as { code?: unknown; message?: unknown; data?: { code?: unknown; name?: unknown } };
    if (typeof e?.code !== "number" || !Number.isInteger(e.code)) return "error code is not an integer";
    if (typeof e.message !== "string") return "error message is not a string";
    const code = e.data?.code;
    if (typeof code !== "string" || !/^[a-z][a-z0-9_]*$/.test(code))
      return `untyped data.code ${String(code)}`;
    if (SQLSTATE.test(code) || /SQLSTATE|\b(22021|22P05|23505|42P01)\b/.test(reply.text))
      return "raw SQLSTATE";
    if (typeof e.data?.name !== "string" || e.data.name === "error")
      return `untyped data.name ${String(e.data?.name)}`;
    if (code === "internal") return "internal error";
  }
  for (const id of reply.text.match(UUID_G) ?? []) {
    const lower = id.toLowerCase();
    if (world.ownerIds.has(lower) && !sentText?.toLowerCase().includes(lower))
      return `reply to ${account} quotes the owner's id ${lower}`;
  }
  if (
    account === "other" &&
    reply.text.includes(world.who.owner.accountId) &&
    !sentText?.includes(world.who.owner.accountId)
  )
    return "reply to the ordinary account quotes the owner's account id";
  return undefined;
}

/** Successful requests that create a root session for their account (the row count must follow them). */
export const successes = { other: 0, admin: 0 };
const creates = (text: string | undefined) => {
  try {
    const v = JSON.parse(text ?? "") as { method?: unknown; params?: { sessionId?: unknown } };
    return v.method === "session.create" || (v.method === "workflow.start" && !v.params?.sessionId);
  } catch {
    return false;
  }
};

/** How the replies fell, per method and outcome (printed once: the fuzz must reach past the refusals). */
export const tally = new Map<string, number>();
export const samples = new Map<string, string>();
export const laneCounts = { keyed: 0, null: 0, notification: 0 };
function tallyReply(text: string | undefined, reply: Reply, account: string): void {
  let method = "?";
  try {
    method = String((JSON.parse(text ?? "") as { method?: unknown }).method).slice(0, 24);
  } catch {}
  const e = reply.frame.error as { data?: { code?: unknown } } | undefined;
  const key = `${method} ${e ? String(e.data?.code) : "result"}`;
  tally.set(key, (tally.get(key) ?? 0) + 1);
  if (!samples.has(`${account} ${key}`))
    samples.set(`${account} ${key}`, `${clip(text, 200)} => ${clip(reply.text, 300)}`);
}

/** Sends keyed frames over one connection, at most WINDOW in flight; every reply is checked. */
export async function runKeyed(lane: Lane, frames: { f: FuzzFrame; key: string }[], problems: string[]) {
  let next = 0;
  let inFlight = 0;
  await new Promise<void>((resolve) => {
    const pump = () => {
      while (inFlight < WINDOW && next < frames.length) {
        const { f, key } = frames[next++] as { f: FuzzFrame; key: string };
        inFlight++;
        let done = false;
        const finish = (problem?: string) => {
          if (done) return;
          done = true;
          lane.waiters.delete(key);
          clearTimeout(timer);
          if (problem) problems.push(`${problem}: sent ${clip(f.text)}`);
          inFlight--;
          if (next >= frames.length && inFlight === 0) resolve();
          else pump();
        };
        const timer = setTimeout(() => finish("no reply in time"), REPLY_TIMEOUT_MS);
        lane.waiters.set(key, () => {
          const replies = lane.byKey.get(key) ?? [];
          const reply = replies[0] as Reply;
          const problem =
            replies.length > 1 ? "more than one reply" : replyProblem(reply, f.text, lane.account);
          if (!problem && "result" in reply.frame && creates(f.text)) successes[lane.account]++;
          tallyReply(f.text, reply, lane.account);
          finish(problem && `${problem} (${clip(reply.text)})`);
        });
        if (lane.byKey.has(key)) lane.waiters.get(key)?.();
        else lane.ws.send(f.text as string);
      }
      if (next >= frames.length && inFlight === 0) resolve();
    };
    pump();
  });
}

/** Frames whose only answer is one reply with id null: sent WINDOW at a time, replies counted. */
async function runNull(lane: Lane, frames: FuzzFrame[], problems: string[]) {
  for (let i = 0; i < frames.length; i += WINDOW) {
    const chunk = frames.slice(i, i + WINDOW);
    const start = lane.nullReplies.length;
    const all = new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), REPLY_TIMEOUT_MS);
      lane.onNull = () => {
        if (lane.nullReplies.length - start >= chunk.length) {
          clearTimeout(timer);
          resolve(true);
        }
      };
    });
    for (const f of chunk) {
      if (f.bytes) lane.ws.send(f.bytes, { binary: true });
      else lane.ws.send(f.text as string);
    }
    const answered = await all;
    lane.onNull = undefined;
    if (!answered) {
      problems.push(
        `${chunk.length - (lane.nullReplies.length - start)} of ${chunk.length} frames got no reply: ${chunk.map((f) => clip(f.text ?? "(binary)", 80)).join(" | ")}`,
      );
      continue;
    }
    await sleep(0);
    const sent = chunk.map((f) => f.text ?? "").join("\n");
    for (const reply of lane.nullReplies.slice(start)) {
      const problem = replyProblem(reply, sent, lane.account);
      if (problem)
        problems.push(
          `${problem} (${clip(reply.text)}) among ${chunk.map((f) => clip(f.text ?? "(binary)", 80)).join(" | ")}`,
        );
    }
    if (lane.nullReplies.length - start !== chunk.length)
      problems.push(`${lane.nullReplies.length - start} replies to ${chunk.length} frames`);
  }
}

let barriers = 0;
/**
 * One request through the whole path, a database read included, on the connection: true once its result
 * is back. The server decides any reply a notification can get (an id-null error) before a handler runs,
 * without I/O, and one connection's replies arrive in the order they were sent: once this result is back,
 * every reply to the frames sent before it is too. Its id (a letter first, no U+0000) is none the
 * generator makes.
 */
async function roundTrip(lane: Lane): Promise<boolean> {
  const id = `barrier-${++barriers}`;
  const key = keyOf(id);
  const answered = new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), REPLY_TIMEOUT_MS);
    lane.waiters.set(key, () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
  lane.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method: "daemon.whoami" }));
  const ok = await answered;
  const reply = lane.byKey.get(key)?.[0];
  lane.waiters.delete(key);
  lane.byKey.delete(key);
  return ok && reply !== undefined && "result" in reply.frame;
}

/** Requests without an id: the server answers at most an id-null error; they are paced, not counted. */
async function runNotifications(lane: Lane, frames: FuzzFrame[], problems: string[]) {
  const start = lane.nullReplies.length;
  for (const f of frames) {
    lane.ws.send(f.text as string);
    await sleep(3);
  }
  // Every reply they can get is in once a request sent after them has its result (a refused one, say
  // too_many_requests, may overtake them: then the fixed wait as before).
  if (!(await roundTrip(lane))) await sleep(200);
  const replies = lane.nullReplies.slice(start);
  if (replies.length > frames.length)
    problems.push(`${replies.length} replies to ${frames.length} notifications`);
  const sent = frames.map((f) => f.text ?? "").join("\n");
  for (const reply of replies) {
    if ("result" in reply.frame)
      problems.push(`a notification was answered with a result: ${clip(reply.text)}`);
    const problem = replyProblem(reply, sent, lane.account);
    if (problem) problems.push(`${problem} (${clip(reply.text)})`);
  }
}

export const clip = (s: string | undefined, n = 300) =>
  s === undefined ? "(none)" : s.length > n ? `${s.slice(0, n)}… (${s.length} chars)` : s;

/** The connections of a run: three keyed for the ordinary account, one for the administrator, one each for null and notifications. */
interface Lanes {
  keyed: Record<Account, Lane[]>;
  nulls: Lane;
  notes: Lane;
}
let lanes: Lanes | undefined;
async function openLanes(): Promise<Lanes> {
  lanes ??= {
    keyed: {
      other: await Promise.all([Lane.open("other"), Lane.open("other"), Lane.open("other")]),
      admin: [await Lane.open("admin")],
    },
    nulls: await Lane.open("other"),
    notes: await Lane.open("other"),
  };
  return lanes;
}

/** Runs one batch: returns every broken property as a line. */
/** Closes the run's connections (the suite's last step). */
export function closeLanes(): void {
  for (const lane of [
    ...(lanes?.keyed.other ?? []),
    ...(lanes?.keyed.admin ?? []),
    lanes?.nulls,
    lanes?.notes,
  ])
    lane?.close();
}

export async function runBatch(frames: FuzzFrame[]): Promise<string[]> {
  const l = await openLanes();
  const problems: string[] = [];
  const keyed = {
    other: l.keyed.other.map(() => [] as { f: FuzzFrame; key: string }[]),
    admin: [[]] as { f: FuzzFrame; key: string }[][],
  };
  const nulls: FuzzFrame[] = [];
  const notes: FuzzFrame[] = [];
  const seenKeys = new Set<string>();
  let spread = 0;
  for (const f of frames) {
    const e = expectationOf(f);
    if (e.kind === "keyed") {
      if (seenKeys.has(e.key)) continue; // the generator's ids are unique; a collision is skipped, not judged
      seenKeys.add(e.key);
      const list = keyed[f.account];
      list[spread++ % list.length]?.push({ f, key: e.key });
    } else if (e.kind === "null") nulls.push(f);
    // Long or state-creating calls are never sent without an id (their outcome could not be counted).
    else if (!NOT_AS_NOTIFICATION.has(e.method)) notes.push(f);
  }
  laneCounts.keyed += seenKeys.size;
  laneCounts.null += nulls.length;
  laneCounts.notification += notes.length;
  await Promise.all([
    ...l.keyed.other.map((lane, i) => runKeyed(lane, keyed.other[i] ?? [], problems)),
    runKeyed(l.keyed.admin[0] as Lane, keyed.admin[0] ?? [], problems),
    runNull(l.nulls, nulls, problems),
    runNotifications(l.notes, notes, problems),
  ]);
  for (const lane of [...l.keyed.other, ...l.keyed.admin, l.nulls, l.notes])
    if (lane.closed) problems.push(`a connection closed: ${JSON.stringify(lane.closed)}`);
  return problems;
}

const NOT_AS_NOTIFICATION = new Set([
  "session.create",
  "session.send",
  "session.delegate",
  "session.tap",
  "workflow.start",
  "workflow.follow",
  "account.create",
  "token.issue",
  "project.add",
]);
