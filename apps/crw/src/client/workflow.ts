import { open } from "node:fs/promises";
import { extname, resolve } from "node:path";
import { CONNECTION_HELP, inputError, out, parse, parseOrExit, withClient, withFollow } from "./common.js";
import { ClientError } from "./connection.js";

const HELP = `Usage: crw workflow <command> [options]

Commands:
  run FILE [--session S] [--model M] [--cwd DIR] [--detach]
                     submit a workflow definition (YAML, or JSON by its .json name), show live progress
                     per node, print the whole-workflow summary (--detach: print the id and return);
                     its nodes work in DIR (default: this directory, or the session's with --session;
                     --no-cwd: none) and a node's own cwd resolves against it
  status WORKFLOW    the workflow's state and its nodes
  follow WORKFLOW    live progress until the workflow ends, then the summary
  cancel WORKFLOW    stop it: running nodes are interrupted, pending ones never start
  land WORKFLOW      merge the branches of its isolated nodes (isolation: worktree) into the branch the
                     work started from, dependencies first (a conflict refuses and names the paths)

A definition: name, nodes (id, task, dependsOn, agentType or role, model, cwd, tools, outputSchema);
see examples/daemon/ for one.

${CONNECTION_HELP}`;

const PREFIX = "crw workflow";
/** Larger than the definition limit the daemon enforces, so its typed refusal is what the user sees. */
const MAX_FILE_BYTES = 1024 * 1024;

async function readDefinition(path: string): Promise<string> {
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(path, "r");
  } catch (e) {
    throw new ClientError(`cannot read ${path}: ${(e as Error).message}`, "unreadable", 2);
  }
  try {
    const size = (await fh.stat()).size;
    if (size > MAX_FILE_BYTES)
      throw new ClientError(`${path} is ${size} bytes; a definition is at most 256 KiB`, "too_large", 2);
    return await fh.readFile("utf8");
  } finally {
    await fh.close();
  }
}

interface NodeView {
  id: string;
  status: string;
}
interface Followed {
  workflowId: string;
  status: string;
  summary: string | null;
  nodes: NodeView[];
}

export async function runWorkflowCli(args: string[]): Promise<number> {
  const parsed = parseOrExit(PREFIX, () =>
    parse(args, {
      session: { type: "string" },
      model: { type: "string" },
      detach: { type: "boolean" },
      cwd: { type: "string" },
      "no-cwd": { type: "boolean" },
    }),
  );
  if (typeof parsed === "number") return parsed;
  const { values, positionals } = parsed;
  const [command, target, extra] = positionals;
  if (values.help || !command) {
    out(HELP);
    return values.help ? 0 : 2;
  }
  if (!target) return inputError(PREFIX, `${command} needs an argument; see 'crw workflow --help'`);
  if (extra) return inputError(PREFIX, `unexpected '${extra}'; see 'crw workflow --help'`);
  const json = values.json === true;
  // a node's status is shown once, also when a reconnect's follow reports it again
  const shown = new Set<string>();
  const follow = async (client: import("./connection.js").DaemonClient, workflowId: string) => {
    client.onNotification((method, params) => {
      if (method !== "workflow.progress" || params.workflowId !== workflowId) return;
      const key = `${String(params.nodeId)}:${String(params.status)}`;
      if (shown.has(key)) return;
      shown.add(key);
      if (json) out(JSON.stringify({ notification: method, ...params }));
      else out(`  ${String(params.nodeId).padEnd(24)} ${params.status}`);
    });
    const done = await client.call<Followed>("workflow.follow", { workflowId });
    if (json) out(JSON.stringify({ ok: done.status === "completed", ...done }));
    else out(`\n${done.summary ?? `workflow ${workflowId} is ${done.status}`}`);
    return done.status === "completed" ? 0 : 1;
  };
  switch (command) {
    case "run":
      return withClient(PREFIX, values, async (client) => {
        const definition = await readDefinition(target);
        const format = extname(target).toLowerCase() === ".json" ? "json" : "yaml";
        // With --session the session's own directory is the default; else the one this command runs in.
        const cwd =
          values["no-cwd"] || (values.session && values.cwd === undefined)
            ? undefined
            : resolve(String(values.cwd ?? "."));
        const started = await client.call<{
          workflowId: string;
          sessionId: string;
          cwd: string | null;
          nodes: string[];
        }>("workflow.start", {
          definition,
          format,
          ...(values.session ? { sessionId: values.session } : {}),
          ...(values.model ? { model: values.model } : {}),
          ...(cwd ? { cwd } : {}),
        });
        if (values.detach) {
          out(json ? JSON.stringify({ ok: true, ...started }) : started.workflowId);
          return 0;
        }
        if (!json)
          out(
            `workflow ${started.workflowId} started (nodes: ${started.nodes.join(", ")}); summary goes to session ${started.sessionId}`,
          );
        try {
          return await follow(client, started.workflowId);
        } catch (e) {
          // started once; only the following goes on, on a new connection
          if (!(e instanceof ClientError) || e.code !== "connection_closed") throw e;
          process.stderr.write(`${PREFIX}: the connection ended; connecting again\n`);
          return withFollow(PREFIX, values, (again) => follow(again, started.workflowId), true);
        }
      });
    case "land":
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{
          landed: {
            nodeId: string;
            branch: string;
            into: string;
            after: string;
            fastForward: boolean;
            alreadyLanded: boolean;
            changedPaths: string[];
          }[];
        }>("workflow.land", { workflowId: target });
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else
          for (const l of r.landed)
            out(
              l.alreadyLanded
                ? `${l.nodeId}: ${l.branch} is already in ${l.into}`
                : `${l.nodeId}: landed ${l.branch} into ${l.into} at ${l.after.slice(0, 12)} (${l.fastForward ? "fast-forward" : "merge commit"}): ${l.changedPaths.join(", ")}`,
            );
        return 0;
      });
    case "follow":
      return withFollow(PREFIX, values, (client) => follow(client, target));
    case "status":
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{ workflowId: string; status: string; nodes: NodeView[] }>(
          "workflow.status",
          { workflowId: target },
        );
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else {
          out(`workflow ${r.workflowId}: ${r.status}`);
          for (const n of r.nodes) out(`  ${n.id.padEnd(24)} ${n.status}`);
        }
        return 0;
      });
    case "cancel":
      return withClient(PREFIX, values, async (client) => {
        const r = await client.call<{ status: string | null; summary: string | null }>("workflow.cancel", {
          workflowId: target,
        });
        if (json) out(JSON.stringify({ ok: true, ...r }));
        else out(r.summary ?? `workflow ${target}: ${r.status}`);
        return 0;
      });
    default:
      return inputError(PREFIX, `unknown command '${command}'; see 'crw workflow --help'`);
  }
}
