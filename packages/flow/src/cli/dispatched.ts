import { join } from "node:path";
import { lockHolder } from "../run/locks.js";
import { type RunPaths, runPaths, stateDirFrom } from "../run/paths.js";
import { readSpec } from "../run/spec.js";
import { REPORT_FORMAT, type Reply, readReply, reportName, writeReport } from "../steps/inbox.js";
import { EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { removeIfExists } from "../util/fsx.js";
import { DirWatch } from "../util/wakeups.js";
import { intOption, numberOption, parseCommand, print } from "./args.js";

const CALL = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** The bound of each wait for the reply: the watch ends it sooner when the reply lands. */
const POLL_MS = 100;

/**
 * `crw flow dispatched RUN CALL --agent ID --k K --attempt N [--wait S]`: writes the dispatch report into
 * the inbox (temporary name + rename), waits up to S seconds (120) for the run's reply and prints it.
 * bound exits 0, every other reply 1; queued (no process answered in time) leaves the report in the
 * inbox for the run to answer when it reaches the step.
 */
export async function dispatchedCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "dispatched",
    args,
    {
      state: { type: "string" },
      agent: { type: "string" },
      k: { type: "string" },
      attempt: { type: "string" },
      wait: { type: "string" },
    },
    ["RUN", "CALL"],
  );
  const call = positionals[1] as string;
  if (!CALL.test(call)) throw new FlowError("input", `call '${call}' is not a call id of a run`, 2);
  const agent = values.agent;
  if (!agent || agent.length > 200 || /[\s/]/.test(agent))
    throw new FlowError("input", "--agent ID is required (the spawned subagent's id)", 2);
  if (values.k === undefined || values.attempt === undefined)
    throw new FlowError("input", "--k K and --attempt N are required", 2);
  const k = intOption("k", values.k, 1, 1);
  const attempt = intOption("attempt", values.attempt, 1, 1);
  const waitMs = numberOption("wait", values.wait, 120) * 1000;
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const spec = readSpec(paths.spec);
  const name = reportName(call, k, attempt, agent);
  // A report sent again (after retry) is a new question: its old reply goes first.
  removeIfExists(join(paths.replies, name));
  writeReport(paths.inbox, {
    format: REPORT_FORMAT,
    run_id: spec.run_id,
    call,
    k,
    attempt,
    agent_id: agent,
    at: new Date().toISOString(),
  });
  const reply = await awaitReply(paths, name, Date.now() + waitMs);
  if (reply) {
    print(values.json, reply, `${reply.reply}: ${reply.reason}`);
    return reply.reply === "bound" ? EXIT_OK : EXIT_REFUSED;
  }
  const queued = {
    reply: "queued",
    run_id: spec.run_id,
    call,
    k,
    attempt,
    agent_id: agent,
    reason:
      "no process of the run answered in time; the report stays in the inbox and the run answers it at the step",
  };
  print(values.json, queued, `queued: ${queued.reason}`);
  return EXIT_REFUSED;
}

/**
 * The run's reply, read as soon as the replies directory changes (and every 100 ms at least: a watch can
 * miss an event), until the deadline or no process holds the run.
 */
async function awaitReply(paths: RunPaths, name: string, deadline: number): Promise<Reply | null> {
  const watch = new DirWatch([paths.replies]);
  try {
    for (;;) {
      const since = watch.version;
      const reply = readReply(paths.replies, name);
      if (reply) return reply;
      if (!lockHolder(paths.runLock) || Date.now() >= deadline) return null;
      await watch.wait(since, Math.min(POLL_MS, Math.max(1, deadline - Date.now())));
    }
  } finally {
    watch.close();
  }
}
