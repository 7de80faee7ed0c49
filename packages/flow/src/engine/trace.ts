import { boundDir } from "../bound/store.js";
import { type TraceDigests, takeTraceDigests, traceWarnings } from "../git/trace.js";
import type { JournalRow, NewRow, RowOf } from "../journal/rows.js";
import { WRITING_ROLES } from "../run/roles.js";
import type { RunSpec } from "../run/spec.js";
import type { FlowEvent } from "./runContext.js";

export interface TraceContext {
  runId: string;
  spec: RunSpec;
  state: string;
  rowsOf(call: string): readonly JournalRow[];
  append(rows: NewRow[]): unknown;
  emit(event: FlowEvent): void;
}

/**
 * SessionConfig.Trace: the run digests a call's P, the owner's checkout (outside P) and the run's shared
 * state (refs under refs/crw/ but the run's own, the flow-bound files) when it binds the call's subagent
 * and when it harvests its answer, and writes a flow_warning row for each change a role should not make:
 * read_role_wrote, executor_wrote_outside, shared_state_changed. Write isolation is recorded, never
 * enforced: the host gives a subagent its parent's sandbox.
 */
export class CallTracer {
  private readonly atBind = new Map<string, Promise<TraceDigests | null>>();

  constructor(private readonly ctx: TraceContext) {}

  onEvent(event: FlowEvent): void {
    if (event.type !== "bound") return;
    const call = event.call;
    this.atBind.set(
      call,
      this.take(call).then((d) => {
        if (d) this.record(call, "bind", d);
        return d;
      }),
    );
  }

  private record(call: string, point: "bind" | "harvest", digests: TraceDigests): void {
    this.ctx.append([{ type: "trace_digests", call, op: call, point, digests }]);
  }

  /** At the harvest, before the call's terminal row: the warnings as flow_warning rows. */
  async harvest(call: string, prepared: RowOf<"prepared">): Promise<void> {
    const bind = await (this.atBind.get(call) ?? Promise.resolve(null));
    this.atBind.delete(call);
    if (!bind) return; // bound by an earlier process: nothing to compare with
    const now = await this.take(call);
    if (!now) return;
    this.record(call, "harvest", now);
    const warnings = traceWarnings({
      writes: WRITING_ROLES.has(prepared.role),
      atBind: bind,
      atHarvest: now,
    });
    if (warnings.length === 0) return;
    this.ctx.append(
      warnings.map((w) => ({
        type: "flow_warning" as const,
        warning: w.warning,
        call,
        op: call,
        detail: { changed: w.changed, at_bind: w.at_bind, at_harvest: w.at_harvest },
      })),
    );
  }

  private async take(call: string): Promise<TraceDigests | null> {
    const rows = this.ctx.rowsOf(call);
    const prepared = rows.find((r) => r.type === "prepared");
    if (prepared?.type !== "prepared") return null;
    let ownerCwd: string | null = this.ctx.spec.repo;
    for (const r of rows) if (r.type === "thread_started" && r.host_cwd) ownerCwd = r.host_cwd;
    try {
      return await takeTraceDigests({
        workspace: prepared.allocation.workspace,
        ownerCwd,
        repo: this.ctx.spec.repo,
        runId: this.ctx.runId,
        boundDir: boundDir(this.ctx.state),
      });
    } catch (e) {
      this.ctx.emit({
        type: "warning",
        message: `${call}: trace digests not taken: ${(e as Error).message}`,
      });
      return null;
    }
  }
}
