import { randomUUID } from "node:crypto";
import type { ChildTurnExecutor } from "./childTurn.js";
import { toError } from "./errors.js";
import { EventLoopSampler } from "./heartbeat.js";
import { ModelCatalog } from "./modelCatalog.js";
import { isBootFrameCandidate, parseBootFrame } from "./protocol/bootFrame.js";
import type { BootFrame } from "./protocol/input.js";
import type { OutputFrame } from "./protocol/output.js";
import type { AgentOptions } from "./protocol/sessionTurn.js";
import type { ProviderUsageReport } from "./providerUsage.js";
import { RetryPolicyMirror } from "./retryPolicyMirror.js";
import type { RunnerBoot, RunnerRequests } from "./runnerRequests.js";
import type { SessionTurnBackend } from "./sessionBackend.js";

/** The runner's side of the IPC channel: `process` in a real runner. */
export interface RunnerPort {
  send(frame: OutputFrame): boolean;
  onMessage(listener: (raw: unknown) => void): void;
  onDisconnect(listener: () => void): void;
  exit(code: number): void;
  log(level: "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>): void;
}

/**
 * Named fault points for crash and failure tests (env CRW_RUNNER_FAULT): the process misbehaves at exactly
 * that point, the way a broken build or a wedged machine would.
 */
export type RunnerFault =
  | "exit-before-hello"
  | "hang-before-hello"
  | "fail-boot"
  | "stall-tap"
  | "garbage-before-hello"
  /** Announce a build identity other than this file's (as a runner forked from a replaced build would). */
  | "other-build";

/** The turn executor, or an import of it; an import is made along with the request handling, after boot. */
export type RunnerExecutor = ChildTurnExecutor | (() => Promise<ChildTurnExecutor>);

export type SessionBackendLoader = (
  options: AgentOptions | undefined,
  hooks: { readonly providerUsage?: ProviderUsageReport },
) => Promise<SessionTurnBackend>;

/**
 * One runner process: handshake (hello with its build identity, then boot), heartbeats, and every later
 * frame handed to RunnerRequests. The boot path is only this module and what it imports: the boot frame is
 * read by its own small validator, while RunnerRequests (the frame schemas and all turn-time code) and an
 * executor given as an import are imported once the boot reply is out, or as soon as a frame needs them.
 * Frames are handled in the order they arrive: while that import is pending they wait, a boot frame behind
 * them included, so a first turn always waits for the import instead of racing it. Frames that fail
 * validation are logged and never acted on.
 */
export class RunnerCore {
  readonly #waiting: unknown[] = [];
  #requests: RunnerRequests | undefined;
  #loading = false;
  #boot: RunnerBoot | undefined;
  #heartbeat: NodeJS.Timeout | undefined;
  #sampler: EventLoopSampler | undefined;
  #seq = 0;
  #stopping = false;

  constructor(
    private readonly port: RunnerPort,
    private readonly executor: RunnerExecutor,
    private readonly buildId: string,
    private readonly fault: RunnerFault | undefined,
    private readonly loadSessionBackend?: SessionBackendLoader,
  ) {}

  start(): void {
    this.port.onMessage((raw) => this.#receive(raw));
    this.port.onDisconnect(() => this.#stop(0, "daemon channel disconnected"));
    if (this.fault === "exit-before-hello") {
      this.port.exit(3);
      return;
    }
    if (this.fault === "hang-before-hello") return;
    if (this.fault === "garbage-before-hello") {
      this.port.send({ type: "hello", requestId: "", buildId: this.buildId } as unknown as OutputFrame);
      this.port.send({
        type: "turnReply",
        requestId: "x",
        result: { ok: 1, error: 2 },
      } as unknown as OutputFrame);
    }
    this.#send({ type: "hello", requestId: randomUUID(), buildId: this.buildId, pid: process.pid });
  }

  #send(frame: OutputFrame): boolean {
    return this.port.send(frame);
  }

  #receive(raw: unknown): void {
    if (this.#requests || (this.#waiting.length === 0 && isBootFrameCandidate(raw))) {
      this.#accept(raw);
      return;
    }
    this.#waiting.push(raw);
    this.#loadRequests();
  }

  #accept(raw: unknown): void {
    if (!isBootFrameCandidate(raw)) {
      this.#requests?.receive(raw);
      return;
    }
    const parsed = parseBootFrame(raw);
    if (!parsed.ok) {
      this.port.log("warn", "refused invalid frame", { issues: parsed.issues });
      return;
    }
    try {
      this.#onBoot(parsed.frame);
    } catch (e) {
      this.port.log("error", "frame handler failed", { type: "boot", error: toError(e).message });
    }
  }

  /** Import the turn-time code once; then handle the frames that waited for it, in order. */
  #loadRequests(): void {
    if (this.#loading) return;
    this.#loading = true;
    const executor = Promise.resolve().then(() =>
      typeof this.executor === "function" ? this.executor() : this.executor,
    );
    Promise.all([import("./runnerRequests.js"), executor]).then(
      ([{ RunnerRequests }, executor]) => {
        if (this.#stopping) return;
        this.#requests = new RunnerRequests({
          port: this.port,
          executor,
          loadSessionBackend: this.loadSessionBackend,
          fault: this.fault,
          booted: () => this.#boot,
          stop: (code, reason) => this.#stop(code, reason),
        });
        for (const raw of this.#waiting.splice(0)) this.#accept(raw);
        this.#requests.warmSessionBackend();
      },
      (e: unknown) => {
        // Without it no frame but boot can be read: a runner that cannot serve exits, and its pending
        // requests fail in the daemon as a runner exit.
        this.port.log("error", "runner could not load its request handling", { error: toError(e).message });
        this.#stop(1, "request handling failed to load");
      },
    );
  }

  #onBoot(frame: BootFrame): void {
    if (this.#boot) {
      this.#refuseBoot(frame, "RunnerBootError", "already_booted", "runner already booted");
      return;
    }
    if (frame.buildId !== this.buildId) {
      this.#refuseBoot(frame, "RunnerStartupError", "build_mismatch", "runner build differs");
      this.#stop(1, "build mismatch");
      return;
    }
    if (this.fault === "fail-boot") {
      this.#refuseBoot(frame, "RunnerBootError", "boot_failed", "boot failed (fault point)");
      this.#stop(1, "boot failed");
      return;
    }
    this.#boot = {
      mirror: new RetryPolicyMirror(frame.retryPolicy),
      catalog: new ModelCatalog(frame.catalog),
      agentOptions: frame.agent,
    };
    this.#sampler = new EventLoopSampler();
    const heartbeat = setInterval(() => this.#beat(), frame.heartbeatIntervalMs);
    heartbeat.unref();
    this.#heartbeat = heartbeat;
    this.#send({
      type: "bootReply",
      requestId: frame.requestId,
      result: { ok: { buildId: this.buildId, policyRevision: frame.retryPolicy.revision } },
    });
    // After the reply is on its way, so the import does not delay ready; a first turn usually finds it done.
    // Request handling loaded before boot (a frame that came first needed it) warms the session backend now.
    setImmediate(() => {
      this.#loadRequests();
      this.#requests?.warmSessionBackend();
    });
  }

  #refuseBoot(frame: BootFrame, name: string, code: string, message: string): void {
    this.#send({ type: "bootReply", requestId: frame.requestId, result: { error: { name, code, message } } });
  }

  #beat(): void {
    this.#seq += 1;
    const load = this.#requests?.load() ?? { turns: 0, sessions: 0 };
    this.#send({
      type: "heartbeat",
      requestId: randomUUID(),
      seq: this.#seq,
      eventLoopP99Ms: this.#sampler?.takeP99Ms() ?? 0,
      rssBytes: process.memoryUsage.rss(),
      ...load,
    });
  }

  #stop(code: number, reason: string): void {
    if (this.#stopping) return;
    this.#stopping = true;
    this.port.log("info", "runner stopping", { reason });
    this.#requests?.close();
    this.#boot?.mirror.dispose();
    this.#sampler?.stop();
    if (this.#heartbeat) clearInterval(this.#heartbeat);
    // Let queued IPC writes (the last replies) flush before the process goes.
    setImmediate(() => this.port.exit(code));
  }
}
