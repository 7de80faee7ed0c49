import { resolve } from "node:path";
import { CONNECTION_HELP, inputError, out, parse, parseOrExit, withClient } from "./common.js";
import type { DaemonClient } from "./connection.js";

const HELP = `Usage: crw session <command> [options]

Commands:
  create [--model M] [--cwd DIR]     make a root session (model: scripted, or <api>:<model id>) working in
                                     DIR (default: this directory; --no-cwd: none, so no coding tools)
  send SESSION TEXT...               send a message: one turn of the session's agent loop; prints its reply
  delegate SESSION TASK...           delegate a task to a child of SESSION [--background] [--model M] [--read-only]
                                     [--cwd DIR] (relative to SESSION's directory; default: SESSION's)
                                     [--isolation worktree] (a git worktree and branch of its own; crw
                                     commits what it leaves and its result names the branch)
  background SESSION                 Ctrl+B: the calls SESSION's turn waits on (Delegate, WorkflowStart) go
                                     on in the background; the turn goes on, each result reaches SESSION
                                     through its inbox
  land CHILD                         merge an isolated child's branch into the branch its work started
                                     from (fast-forward when possible; a conflict refuses; never a force)
  read SESSION [--limit N]           the session's recent messages and its last answer
  status SESSION                     where the session executes now (a runner, the daemon, or nowhere),
                                     its open delegated call and its runner's load
  fork-prefix SESSION                the newest provider response's prompt cache figures; for a fork,
                                     whether it read its parent's cached prefix

TEXT or TASK '-' reads it from standard input.

${CONNECTION_HELP}`;

const PREFIX = "crw session";

async function textArg(parts: string[]): Promise<string> {
  if (parts.length === 1 && parts[0] === "-") {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString("utf8");
  }
  return parts.join(" ");
}

/**
 * Prints the call's progress until the returned function is called: the command's answer is its last
 * output, so a background child's progress arriving after it (follow that with `crw tap`) is not printed.
 */
function printProgress(client: DaemonClient, json: boolean): () => void {
  let answered = false;
  client.onNotification((method, params) => {
    if (method !== "session.progress" || answered) return;
    if (json) {
      out(JSON.stringify({ notification: method, ...params }));
      return;
    }
    const e = params as { type: string; sessionId: string; toolName?: string; text?: string };
    if (e.type === "tool") process.stderr.write(`  [${e.sessionId.slice(0, 8)}] tool ${e.toolName}\n`);
    else if (e.type === "session")
      process.stderr.write(`  [${e.sessionId.slice(0, 8)}] child session started\n`);
  });
  return () => {
    answered = true;
  };
}

export async function runSessionCli(args: string[]): Promise<number> {
  const parsed = parseOrExit(PREFIX, () =>
    parse(args, {
      model: { type: "string" },
      background: { type: "boolean" },
      "read-only": { type: "boolean" },
      limit: { type: "string" },
      cwd: { type: "string" },
      "no-cwd": { type: "boolean" },
      isolation: { type: "string" },
    }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  const [command, ...rest] = positionals;
  if (values.help || !command) {
    out(HELP);
    return values.help ? 0 : 2;
  }
  const json = values.json === true;
  switch (command) {
    case "create":
      return withClient(PREFIX, values, async (client) => {
        const cwd = values["no-cwd"] ? undefined : resolve(String(values.cwd ?? "."));
        const r = await client.call<{ sessionId: string; model: string; cwd: string | null }>(
          "session.create",
          {
            ...(values.model ? { model: values.model } : {}),
            ...(cwd ? { cwd } : {}),
          },
        );
        out(json ? JSON.stringify({ ok: true, ...r }) : r.sessionId);
        return 0;
      });
    case "send": {
      const [sessionId, ...words] = rest;
      if (!sessionId || words.length === 0)
        return inputError(PREFIX, "send needs SESSION and TEXT; see 'crw session --help'");
      const text = await textArg(words);
      return withClient(PREFIX, values, async (client) => {
        printProgress(client, json);
        const r = await client.call<{
          stopReason: string;
          errorMessage: string | null;
          reply: string | null;
        }>("session.send", { sessionId, text, ...(values["read-only"] ? { readOnly: true } : {}) });
        if (json) out(JSON.stringify({ ok: r.stopReason === "stop", ...r }));
        else if (r.stopReason === "stop") out(r.reply ?? "(no answer)");
        else
          process.stderr.write(`${PREFIX}: the turn ended with ${r.stopReason}: ${r.errorMessage ?? ""}\n`);
        return r.stopReason === "stop" ? 0 : 1;
      });
    }
    case "delegate": {
      const [sessionId, ...words] = rest;
      if (!sessionId || words.length === 0)
        return inputError(PREFIX, "delegate needs SESSION and TASK; see 'crw session --help'");
      const task = await textArg(words);
      return withClient(PREFIX, values, async (client) => {
        const answered = printProgress(client, json);
        const r = await client.call<{
          kind: string;
          childSessionId: string;
          outcome?: string;
          body?: string;
          runId?: string;
          stalledMs?: number;
        }>("session.delegate", {
          sessionId,
          task,
          ...(values.background ? { background: true } : {}),
          ...(values.model ? { model: values.model } : {}),
          ...(values["read-only"] ? { readOnly: true } : {}),
          // A relative directory is the parent session's business: it resolves against the parent's own.
          ...(typeof values.cwd === "string" ? { cwd: values.cwd } : {}),
          ...(typeof values.isolation === "string" ? { isolation: values.isolation } : {}),
        });
        answered();
        if (json) out(JSON.stringify({ ok: r.outcome !== "error", ...r }));
        else if (r.kind === "result") out(r.body ?? "");
        else
          out(
            `child ${r.childSessionId} ${r.stalledMs ? `showed no progress for ${Math.round(r.stalledMs / 1000)} s and goes on` : "started"} in the background; follow it with 'crw tap ${r.childSessionId}'; its result is delivered to session ${sessionId}`,
          );
        return r.outcome === "error" ? 1 : 0;
      });
    }
    case "background": {
      const [sessionId] = rest;
      if (!sessionId) return inputError(PREFIX, "background needs SESSION; see 'crw session --help'");
      return withClient(PREFIX, values, async (client) => {
        type Moved = { moved: boolean; reason?: string };
        const r = await client.call<{
          delegations: (Moved & { runId: string })[];
          workflows: (Moved & { workflowId: string })[];
        }>("session.background", { sessionId });
        const all = [
          ...r.delegations.map((d) => ({ what: `delegated call ${d.runId}`, ...d })),
          ...r.workflows.map((w) => ({ what: `workflow ${w.workflowId}`, ...w })),
        ];
        if (json) out(JSON.stringify({ ok: all.every((m) => m.moved), ...r }));
        else if (all.length === 0)
          out(`nothing of session ${sessionId} waits in the foreground on this daemon`);
        for (const m of json ? [] : all)
          out(
            m.moved
              ? `${m.what} goes on in the background`
              : `${m.what} stays in the foreground: ${m.reason}`,
          );
        return all.every((m) => m.moved) ? 0 : 1;
      });
    }
    case "land": {
      const [childId] = rest;
      if (!childId) return inputError(PREFIX, "land needs CHILD; see 'crw session --help'");
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{
          branch: string;
          into: string;
          after: string;
          fastForward: boolean;
          alreadyLanded: boolean;
          diff: { summary: string; files: { path: string; status: string }[] };
        }>("session.land", { sessionId: childId });
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else if (r.alreadyLanded) out(`${r.branch} is already in ${r.into}`);
        else {
          out(
            `landed ${r.branch} into ${r.into} at ${r.after.slice(0, 12)} (${r.fastForward ? "fast-forward" : "merge commit"}): ${r.diff.summary}`,
          );
          for (const f of r.diff.files) out(`  ${f.status.padEnd(9)} ${f.path}`);
        }
        return 0;
      });
    }
    case "read": {
      const [sessionId] = rest;
      if (!sessionId) return inputError(PREFIX, "read needs SESSION; see 'crw session --help'");
      const limit = values.limit === undefined ? undefined : Number(values.limit);
      if (limit !== undefined && (!Number.isInteger(limit) || limit < 1 || limit > 1000))
        return inputError(PREFIX, `--limit must be a whole number 1..1000, not '${values.limit}'`);
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{
          session: { id: string; kind: string; parentSessionId: string | null; model: string };
          openRun: { id: string; status: string } | null;
          reply: string | null;
          messages: { seq: number; role: string; text?: string; toolName?: string }[];
        }>("session.read", { sessionId, ...(limit ? { limit } : {}) });
        if (json) {
          out(JSON.stringify({ ok: true, ...r }));
          return 0;
        }
        out(
          `session ${r.session.id} (${r.session.kind}${r.session.parentSessionId ? `, child of ${r.session.parentSessionId}` : ""}, model ${r.session.model})${r.openRun ? ` — working (${r.openRun.status})` : ""}`,
        );
        for (const m of r.messages) out(formatMessage(m));
        return 0;
      });
    }
    case "status": {
      const [sessionId] = rest;
      if (!sessionId) return inputError(PREFIX, "status needs SESSION; see 'crw session --help'");
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{
          sessionId: string;
          kind: string;
          parentSessionId: string | null;
          execution: { location: string; runnerId?: string | null; state?: string };
          delegation: { runId: string; status: string; mode: string } | null;
          process: { runnerId: string; turns: number; sessions: number; memoryBytes: number | null } | null;
        }>("session.status", { sessionId });
        if (json) {
          out(JSON.stringify({ ok: true, ...r }));
          return 0;
        }
        const e = r.execution;
        const where =
          e.location === "runner"
            ? `in ${e.runnerId ?? "a runner"} (${e.state})`
            : e.location === "in-process"
              ? "in the daemon's process (running)"
              : "not executing";
        out(
          `session ${r.sessionId} (${r.kind}${r.parentSessionId ? `, child of ${r.parentSessionId}` : ""}): ${where}`,
        );
        if (r.delegation) out(`  call ${r.delegation.runId}: ${r.delegation.status} (${r.delegation.mode})`);
        if (r.process) {
          const mem =
            r.process.memoryBytes === null
              ? "not measured yet"
              : `${Math.round(r.process.memoryBytes / 1e6)} MB`;
          out(`  ${r.process.runnerId}: ${r.process.turns} turns, ${r.process.sessions} sessions, ${mem}`);
        }
        return 0;
      });
    }
    case "fork-prefix": {
      const [sessionId] = rest;
      if (!sessionId) return inputError(PREFIX, "fork-prefix needs SESSION; see 'crw session --help'");
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<ForkPrefixView>("session.forkPrefix", { sessionId });
        if (json) {
          out(JSON.stringify({ ok: true, ...r }));
          return 0;
        }
        for (const line of formatForkPrefix(r)) out(line);
        return 0;
      });
    }
    default:
      return inputError(PREFIX, `unknown command '${command}'; see 'crw session --help'`);
  }
}

export function formatMessage(m: { seq: number; role: string; text?: string; toolName?: string }): string {
  const head = m.role === "toolResult" ? `tool ${m.toolName}` : m.role;
  const text = (m.text ?? "").replace(/\n/g, "\n      ");
  return `${String(m.seq).padStart(4)}  ${head}: ${text}`;
}

interface UsageResponseView {
  seq: number;
  promptTokens: number;
  cacheReadRatio: number;
  usage: { model: string; cacheRead: number; cacheWrite: number };
}

/** What `session.forkPrefix` answers (the delegation core's fork-prefix diagnostics). */
export interface ForkPrefixView {
  sessionId: string;
  parentSessionId: string | null;
  fork: boolean;
  inheritedThrough: number | null;
  response: UsageResponseView | null;
  parentResponse: UsageResponseView | null;
  parentCachedTokens: number | null;
  prefixFromCache: boolean | null;
}

const pct = (ratio: number) => `${Math.round(ratio * 100)}%`;

/** The human lines of `crw session fork-prefix`: one headline, then the responses it was judged from. */
export function formatForkPrefix(r: ForkPrefixView): string[] {
  const response = (label: string, x: UsageResponseView) =>
    `  ${label}: row ${x.seq}, ${x.usage.model}, ${x.promptTokens} prompt tokens, ${x.usage.cacheRead} read from cache (${pct(x.cacheReadRatio)}), ${x.usage.cacheWrite} written`;
  const lines: string[] = [];
  if (!r.fork) {
    lines.push(
      r.response
        ? `session ${r.sessionId} is not a fork; its newest provider response read ${pct(r.response.cacheReadRatio)} of its prompt from the cache`
        : `session ${r.sessionId} is not a fork and has no provider response with usage`,
    );
  } else {
    const verdict =
      r.prefixFromCache === true
        ? "read its parent's prefix from the cache"
        : r.prefixFromCache === false
          ? `did not read its parent's prefix from the cache (${r.response?.usage.cacheRead ?? 0} of ${r.parentCachedTokens} cached tokens)`
          : !r.response
            ? "cannot be judged yet: it has no provider response with usage"
            : !r.parentResponse
              ? "cannot be judged: the parent's request for the prefix reported no usage"
              : "cannot be judged: the parent's request cached nothing";
    lines.push(
      `fork ${r.sessionId} of ${r.parentSessionId} (inherited rows 1-${r.inheritedThrough}): ${verdict}`,
    );
  }
  if (r.response) lines.push(response("response", r.response));
  if (r.parentResponse) lines.push(response("parent's request", r.parentResponse));
  return lines;
}
