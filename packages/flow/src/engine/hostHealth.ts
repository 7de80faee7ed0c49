import type { HostResult, SessionHost } from "../host/sessionHost.js";
import type { JournalRow, NewRow } from "../journal/rows.js";
import { diagnoseHost, type HostDiagnosis } from "../run/hostDiagnosis.js";

/**
 * How many host answers in a row may be `unreachable` before the run says so. The run goes on trying
 * (the host may come back), but the owner and the person watching are told why and what to do, once per
 * outage: a `host_unreachable` flow warning, then `host_reachable` when an answer comes through again.
 */
export const UNREACHABLE_BOUND = 5;

export interface HostHealthSink {
  readonly hostSpec: string;
  readonly env: NodeJS.ProcessEnv;
  rows(): readonly JournalRow[];
  append(rows: NewRow[]): JournalRow[];
}

export class HostHealth {
  private failures = 0;
  private lastMessage = "";

  constructor(private readonly sink: HostHealthSink) {}

  /** The rows' word on the host, read once; this class writes every later such row itself. */
  private state: HostDiagnosis | null | undefined;

  /** The diagnosis while the host counts as unreachable (past the bound), else null. */
  down(): HostDiagnosis | null {
    if (this.state === undefined) {
      const last = [...this.sink.rows()]
        .reverse()
        .find(
          (r) =>
            r.type === "flow_warning" && (r.warning === "host_unreachable" || r.warning === "host_reachable"),
        );
      this.state =
        last?.type === "flow_warning" && last.warning === "host_unreachable"
          ? (last.detail as unknown as HostDiagnosis)
          : null;
    }
    return this.state;
  }

  note(result: HostResult<unknown>): void {
    if (!result.ok && result.reason === "unreachable") {
      this.failures++;
      this.lastMessage = result.message;
      if (this.failures === UNREACHABLE_BOUND && !this.down()) {
        const d = diagnoseHost(this.sink.hostSpec, this.lastMessage, this.sink.env);
        const detail = { ...d, failures: this.failures } as Record<string, unknown>;
        this.sink.append([{ type: "flow_warning", warning: "host_unreachable", detail }]);
        this.state = d;
      }
      return;
    }
    this.failures = 0;
    if (this.down()) {
      this.sink.append([{ type: "flow_warning", warning: "host_reachable" }]);
      this.state = null;
    }
  }

  /** The host with every answer noted. */
  watch(host: SessionHost): SessionHost {
    const noted = <T>(p: Promise<HostResult<T>>): Promise<HostResult<T>> =>
      p.then((r) => {
        this.note(r);
        return r;
      });
    const readStatus = host.readStatus?.bind(host);
    return {
      readThread: (id) => noted(host.readThread(id)),
      listSubagents: (owner) => noted(host.listSubagents(owner)),
      readTokenCount: (thread) => noted(host.readTokenCount(thread)),
      interruptTurn: (thread, turn) => noted(host.interruptTurn(thread, turn)),
      startTurn: (thread, text) => noted(host.startTurn(thread, text)),
      ...(readStatus ? { readStatus: (id: string) => noted(readStatus(id)) } : {}),
      ...(host.onThreadEvent ? { onThreadEvent: host.onThreadEvent.bind(host) } : {}),
      close: () => host.close(),
    };
  }
}
