import { parseCommand, print } from "../cli/args.js";
import { launchRunProcess, recordedTmpdirProblem } from "../run/launch.js";
import { lockHolder, tryLock, unlock } from "../run/locks.js";
import { runPaths, stateDirFrom } from "../run/paths.js";
import { readSpec } from "../run/spec.js";
import { EXIT_OK, EXIT_REFUSED, FlowError } from "../util/errors.js";
import { sleep } from "../util/fsx.js";

/**
 * `crw flow answer RUN DECISION ANSWER [--no-resume] [--wait S]`: answers a decision the run waits for
 * (waiting_decision). Without --no-resume the recorded TMPDIR is checked first: an unusable one refuses
 * with run_env_unusable (exit 1) before anything is drained, appended or started. The answer then drains
 * the run (waits up to S seconds, 60 by default, for the process that paused to end), holds the run lock
 * from the end of that process until its decision_answered row is stored, lets it go, and starts the
 * resume, which takes the lock after. A decision is answered once: a second answer is refused.
 * --no-resume stores the answer and starts nothing; the later relaunch checks the TMPDIR.
 */
export async function answerCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseCommand(
    "answer",
    args,
    { state: { type: "string" }, "no-resume": { type: "boolean" }, wait: { type: "string" } },
    ["RUN", "DECISION", "ANSWER"],
  );
  const paths = runPaths(stateDirFrom(values.state), positionals[0] as string);
  const decision = positionals[1] as string;
  const answer = positionals[2] as string;
  const spec = readSpec(paths.spec);
  const resume = !values["no-resume"];
  if (resume) {
    const problem = recordedTmpdirProblem(spec);
    if (problem) {
      throw new FlowError(
        "run_env_unusable",
        `run ${spec.run_id}: the run's recorded ${problem}; make the directory again, then answer again`,
        EXIT_REFUSED,
      );
    }
  }
  const waitS = values.wait === undefined ? 60 : Number(values.wait);
  if (!Number.isFinite(waitS) || waitS < 0)
    throw new FlowError("input", "--wait is not a number of seconds", 2);
  // drain: the process that paused the run ends; then this command holds the run until its row is stored
  const deadline = Date.now() + waitS * 1000;
  for (;;) {
    if (!lockHolder(paths.startLock) && tryLock(paths.runLock, { pid: process.pid })) break;
    if (Date.now() > deadline) {
      throw new FlowError(
        "run_live",
        `run ${spec.run_id}: a process still holds the run; answer again later`,
        EXIT_REFUSED,
      );
    }
    await sleep(50);
  }
  try {
    const { JournalWriter } = await import("../journal/journal.js");
    const { writer } = JournalWriter.open(paths.journal, process.env);
    try {
      const ended = writer.rows.find((r) => r.type === "run_ended");
      if (ended?.type === "run_ended") {
        throw new FlowError(
          "input",
          `run ${spec.run_id} has ended (${ended.status}); its decisions are not answered any more`,
          EXIT_REFUSED,
        );
      }
      const requested = writer.rows.find((r) => r.type === "decision_requested" && r.decision === decision);
      if (requested?.type !== "decision_requested") {
        throw new FlowError("input", `run ${spec.run_id} waits for no decision '${decision}'`, EXIT_REFUSED);
      }
      if (writer.rows.some((r) => r.type === "decision_answered" && r.decision === decision)) {
        throw new FlowError(
          "input",
          `decision '${decision}' of run ${spec.run_id} is answered already`,
          EXIT_REFUSED,
        );
      }
      if (requested.options && !requested.options.includes(answer)) {
        throw new FlowError("input", `'${answer}' is not one of ${requested.options.join(", ")}`, 2);
      }
      writer.append([{ type: "decision_answered", decision, answer }]);
    } finally {
      writer.close();
    }
  } finally {
    unlock(paths.runLock);
  }
  const pid = resume ? launchRunProcess(paths, spec) : null;
  print(
    values.json,
    { run_id: spec.run_id, decision, answer, resumed_pid: pid },
    resume
      ? `decision ${decision} answered; run ${spec.run_id} resumed (pid ${pid})`
      : `decision ${decision} answered; run ${spec.run_id} not resumed (--no-resume): crw flow resume ${spec.run_id}`,
  );
  return EXIT_OK;
}
