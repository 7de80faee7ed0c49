import { readFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import type { HostThread } from "../host/sessionHost.js";
import type { RowOf } from "../journal/rows.js";
import { REPORT_FORMAT, type Reply, type ReplyKind, writeReply } from "../steps/inbox.js";
import { type BindVerdict, judgeBind } from "./bind.js";
import { stepPair } from "./bindStep.js";
import { foldCall } from "./callFold.js";
import type { RunContext } from "./runContext.js";

const ReportSchema = z.object({
  format: z.literal(REPORT_FORMAT),
  run_id: z.string().max(200),
  call: z.string().max(200),
  k: z.number().int().positive(),
  attempt: z.number().int().positive(),
  agent_id: z.string().min(1).max(200),
  at: z.string().max(100),
});
export type Report = z.infer<typeof ReportSchema>;

export type BindHandler = (
  thread: HostThread,
  verdict: Extract<BindVerdict, { verdict: "bind" }>,
) => Promise<{ bound: true } | { bound: false; reason: string }>;

function readReport(rc: RunContext, name: string): Report | null {
  try {
    const text = readFileSync(join(rc.paths.inbox, name), "utf8");
    if (text.length > 64 * 1024) return null;
    const r = ReportSchema.safeParse(JSON.parse(text));
    return r.success ? r.data : null;
  } catch {
    return null;
  }
}

function answer(
  rc: RunContext,
  name: string,
  report: Report,
  reply: ReplyKind,
  reason: string,
  extra: Partial<Reply> = {},
): void {
  writeReply(rc.paths.replies, name, {
    format: "crw-flow-reply/1",
    reply,
    run_id: rc.runId,
    call: report.call,
    k: report.k,
    attempt: report.attempt,
    agent_id: report.agent_id,
    reason,
    ...extra,
    at: new Date().toISOString(),
  });
  // not listed as unanswered again (another call or the run's loop would answer it twice)
  rc.answered(name);
  rc.emit({ type: "reply", name, reply, reason });
}

/** A refusal's reason, told when the refusal held the call that no further spawn is wanted. */
function heldReason(reason: string, held: string | null): string {
  return held ? `${reason}; the call is now held for a decision, spawn nothing more for it: ${held}` : reason;
}

/**
 * Answers the unanswered reports for a call's waiting step (the reports wait in the inbox, a resumed run
 * answers them first). Answers true when one of them bound the step.
 */
export async function answerReports(
  rc: RunContext,
  call: string,
  step: RowOf<"step_published">,
  onBind: BindHandler,
): Promise<boolean> {
  const prefix = `${call}.t${step.k}-a${step.attempt}.`;
  for (const name of rc.unanswered()) {
    if (!name.startsWith(prefix)) continue;
    const report = readReport(rc, name);
    if (!report || report.call !== call || report.k !== step.k || report.attempt !== step.attempt) continue;
    if (report.run_id !== rc.runId) {
      answer(rc, name, report, "refused", `the report is for run ${report.run_id}, not ${rc.runId}`);
      continue;
    }
    const r = await rc.host.readThread(report.agent_id);
    if (!r.ok) {
      const down = r.reason === "unreachable" ? rc.hostHealth?.down() : null;
      const reason = down
        ? `crw cannot reach the owner's Codex host ${down.host}: ${down.why}. To fix: ${down.fix}`
        : `the host cannot show ${report.agent_id} yet (${r.reason}): ${r.message}`;
      const held = rc.refusals?.note(call, step, "retry", report.agent_id, reason) ?? null;
      answer(rc, name, report, "retry", heldReason(reason, held));
      if (held) return false;
      continue;
    }
    const v = judgeBind(step, r.value, rc.owner, stepPair(rc, step));
    if (v.verdict === "bind") {
      const b = await onBind(r.value, v);
      if (!b.bound) {
        // the subagent stays unbound (its call is held): close it
        answer(rc, name, report, "close", b.reason);
        return true;
      }
      answer(rc, name, report, "bound", `subagent ${report.agent_id} is bound to ${step.marker}`);
      rc.emit({ type: "bound", call, marker: step.marker, agent: report.agent_id, via: "report" });
      return true;
    }
    // an owner that answers each refusal with the same again is held after a bound, not refused forever
    // (a subagent spawned without the step's message never shows its marker: its retries are bounded too)
    const held = rc.refusals?.note(call, step, v.verdict, report.agent_id, v.reason) ?? null;
    const mismatch = v.verdict === "pair_mismatch";
    const reason =
      mismatch && !held ? `${v.reason}: close it and spawn again with the role's pair` : v.reason;
    answer(rc, name, report, v.verdict, heldReason(reason, held), mismatch ? { pair: v.pair } : {});
    if (held) return false;
  }
  return false;
}

/**
 * Answers reports no waiting step claims, from the rows: another run's (refused), an attempt that ended
 * or a second subagent for a bound attempt (close), a step not published (close: an early report), the
 * bound subagent reported again (bound). A report for a published step that waits is left to its call.
 */
export async function answerStrayReports(rc: RunContext): Promise<void> {
  // the owner may have read rows of the file that are not durable yet (an attempt that just ended): they
  // are in `rows` before a report is judged against them
  await rc.journal.flushed();
  for (const name of rc.unanswered()) {
    const report = readReport(rc, name);
    if (!report) {
      refuseInvalid(rc, name);
      continue;
    }
    if (report.run_id !== rc.runId) {
      answer(rc, name, report, "refused", `the report is for run ${report.run_id}, not ${rc.runId}`);
      continue;
    }
    const rows = rc.rowsOf(report.call);
    const fold = foldCall(rows);
    const step = fold.steps.find((s) => s.k === report.k && s.attempt === report.attempt);
    if (!step) {
      answer(
        rc,
        name,
        report,
        "close",
        `the run published no step ${report.call}/t${report.k}-a${report.attempt}`,
      );
      continue;
    }
    const pos = fold.position;
    const awaiting = pos?.kind === "await_bind" && pos.step.marker === step.marker;
    // its call answers it (or will, once a resume's replay comes back to the step)
    if (awaiting) continue;
    const boundThread = fold.threads.find((t) => t.attempt === report.attempt);
    const attemptEnded =
      pos?.kind === "terminal" ||
      fold.lostAttempts.includes(report.attempt) ||
      rows.some((r) => r.type === "held" && r.seq > (boundThread?.seq ?? step.seq));
    if (boundThread && boundThread.thread_id === report.agent_id && !attemptEnded) {
      answer(rc, name, report, "bound", `subagent ${report.agent_id} is bound to ${step.marker}`);
    } else if (boundThread && boundThread.thread_id === report.agent_id) {
      answer(rc, name, report, "close", `attempt ${report.attempt} of ${report.call} has ended`);
    } else if (boundThread || step.action === "send_input") {
      answer(
        rc,
        name,
        report,
        "close",
        `attempt ${report.attempt} of ${report.call} is bound to another subagent`,
      );
    } else {
      answer(rc, name, report, "close", `attempt ${report.attempt} of ${report.call} has ended`);
    }
  }
}

/**
 * A report that is not a valid dispatch report (no subagent, wrong types, not JSON) is refused, under its
 * own name, with what is known of it; it never binds anything.
 */
function refuseInvalid(rc: RunContext, name: string): void {
  let raw: Record<string, unknown> = {};
  try {
    const text = readFileSync(join(rc.paths.inbox, name), "utf8");
    if (text.length <= 64 * 1024) raw = (JSON.parse(text) as Record<string, unknown>) ?? {};
  } catch {
    // not JSON: refused all the same
  }
  const str = (v: unknown) => (typeof v === "string" ? v.slice(0, 200) : "");
  const int = (v: unknown) => (Number.isInteger(v) && (v as number) > 0 ? (v as number) : 1);
  answer(
    rc,
    name,
    {
      format: REPORT_FORMAT,
      run_id: str(raw.run_id),
      call: str(raw.call),
      k: int(raw.k),
      attempt: int(raw.attempt),
      agent_id: str(raw.agent_id),
      at: "",
    },
    "refused",
    typeof raw.agent_id === "string" && raw.agent_id
      ? "the report is not a valid dispatch report"
      : "the report names no subagent",
  );
}
