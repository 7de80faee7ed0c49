import { randomUUID } from "node:crypto";
import { resolve as resolvePath } from "node:path";
import { delegatedWorkDir, type WorkDirPlacement, type WorkDirPolicy } from "@crw/brain";
import { type HostWorkflowNodeDispatch, runWithWorkflowNodeDispatch } from "@crw/subagent";
import { outputSchemaProblem } from "../definition/outputSchema.js";
import type { WorkflowNode } from "../definition/schema.js";
import { toError, WorkflowNodePreparationError, WorkflowStateError } from "../errors.js";
import {
  journaledError,
  type NodeState,
  type OrchestrationJournal,
  TERMINAL_NODE_STATUSES,
} from "../journal/schema.js";
import type { PgArtifactStore } from "../store/artifacts.js";
import type { PgWorkflowStore, WorkflowStatus } from "../store/native.js";
import { captureNodeScope } from "./access.js";
import type { OriginBindings, SummaryWriter } from "./context.js";
import type {
  NodeDispatcher,
  NodeEvent,
  NodeOutputReference,
  NodeRecoveryHost,
  NodeRunResult,
  RecoveryContinueNode,
} from "./dispatch.js";
import { workflowFault } from "./faults.js";
import { commitNodeWork, isolateNode, type NodeIsolation, rememberNodeWorktree } from "./isolation.js";
import { JournalChanges } from "./journalChanges.js";
import { ownEntry } from "./own.js";
import { handoverOf, nodePrompt, workflowSummary } from "./prompt.js";
import type { SnapshotPublisher, WorkflowEmitResult, WorkflowSnapshot } from "./publication.js";
import { NodeReadiness } from "./readiness.js";
import type { NodeSlots } from "./slots.js";

export { NodeSlots } from "./slots.js";

export type WorkflowEvent =
  | {
      readonly type: "node";
      readonly workflowId: string;
      readonly nodeId: string;
      readonly status: NodeState["status"];
    }
  | {
      readonly type: "workflow";
      readonly workflowId: string;
      readonly status: WorkflowStatus;
      readonly resultId?: string;
    }
  | { readonly type: "invalid_journal"; readonly workflowId: string; readonly reason: string }
  | { readonly type: "stale"; readonly workflowId: string; readonly generation: number }
  /** A Ctrl+B background snapshot could not be written; the foreground waiter stays attached. */
  | { readonly type: "background_failed"; readonly workflowId: string; readonly error: Error }
  /** The database failed under the run: this process stops driving it; the rows stay for recovery. */
  | { readonly type: "run_lost"; readonly workflowId: string; readonly error: Error }
  /** Progress of a node's turn (text, tool use), as its dispatcher reports it. */
  | {
      readonly type: "node_progress";
      readonly workflowId: string;
      readonly nodeId: string;
      readonly event: NodeEvent;
    }
  /** A node's preparation or operation threw: the original error, its `cause` chain intact (memory only). */
  | {
      readonly type: "node_error";
      readonly workflowId: string;
      readonly nodeId: string;
      readonly error: Error;
    };

export interface WorkflowOutcome {
  readonly workflowId: string;
  /** null when this run was superseded (a stale write): a newer run owns the workflow. */
  readonly status: WorkflowStatus | null;
  readonly summary: string | null;
  readonly resultId: string | null;
}

export interface RunDeps {
  readonly owner: string;
  /** Used when no live origin bound a writer (boot). */
  readonly summaryWriter: SummaryWriter | null;
  readonly store: PgWorkflowStore;
  /** null: a minimal composition without shared artifacts (no artifact stored, no grant minted). */
  readonly artifacts: PgArtifactStore | null;
  readonly dispatcher: NodeDispatcher;
  readonly publisher: SnapshotPublisher;
  readonly defaultModel: string;
  readonly workDirPolicy: WorkDirPolicy | null;
  readonly admitNodeWorkDir?: (placement: WorkDirPlacement) => Promise<void>;
  /** Where isolated nodes get their worktrees; null refuses `isolation: worktree`. */
  readonly isolation?: NodeIsolation | null;
  readonly onEvent: (event: WorkflowEvent) => void;
  /** The engine-wide cap on nodes executing at once (the plugin's job cap, on top of any runner queue). */
  readonly slots?: NodeSlots | null;
  /** The boot recovery hook's continueNode (the dispatcher's own when the host supplies none). */
  readonly recoveryContinue?: RecoveryContinueNode | null;
  readonly onCompletion: (completion: {
    workflowId: string;
    parentSessionId: string;
    principalAccountId: string;
    resultId: string;
    status: WorkflowStatus;
  }) => Promise<void>;
}

type Mode = "fresh" | "prepare" | "continue" | "retry";

/**
 * One workflow's run state in this process: the journal (each write names the nodes that changed, fenced
 * by lease and generation), its serialized publication, and the nodes executing here. The journal and the native record are the
 * truth; this object only drives them and can be rebuilt from them at boot.
 */
export class WorkflowRun {
  readonly active = new Map<string, { controller: AbortController; done: Promise<void> }>();
  /** Nodes whose child turn was actually started (a cancel interrupts these; the others never started). */
  readonly started = new Set<string>();
  #writes: Promise<boolean> = Promise.resolve(true);
  /** What the rows hold of this run's journal (theirs while the lease is ours): each write names what changed. */
  readonly #changes = new JournalChanges();
  readonly #readiness = new NodeReadiness();
  /** The queued journal write that has not started yet: later persists join it (see persist). */
  #nextWrite: { readonly generation: number; written: Promise<boolean> } | undefined;
  #stopped = false;
  #finishing = false;
  #note: string | undefined;
  #bindings: OriginBindings | null = null;
  /** A foreground waiter is attached (WorkflowStart waiting for the summary as its result). */
  #foreground = false;
  #background = false;
  #released!: () => void;
  /** Resolves when a foreground waiter is let go by a persisted background snapshot. */
  readonly released: Promise<void> = new Promise((r) => {
    this.#released = r;
  });
  #resolve!: (outcome: WorkflowOutcome) => void;
  readonly finished: Promise<WorkflowOutcome>;

  /**
   * `ready` holds journal writes back until the created receipt's proof is adopted: a Stop that arrives
   * before it still queues its snapshot at once, and journals after the native record exists.
   */
  /** Rebuilt from its journal at boot: a running node's child may have worked before the restart. */
  rebuilt = false;

  constructor(
    public journal: OrchestrationJournal,
    private readonly deps: RunDeps,
    ready: Promise<unknown> = Promise.resolve(),
  ) {
    this.#writes = ready.then(
      () => true,
      () => false,
    );
    this.finished = new Promise((r) => {
      this.#resolve = r;
    });
  }

  /** The live origin's completion sink and summary writer (absent after a boot: the engine's own are used). */
  bind(bindings: OriginBindings): void {
    this.#bindings = bindings;
  }

  get id(): string {
    return this.journal.workflowId;
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /** Stops driving the workflow without writing anything (lease lost, superseded, or the process closing). */
  abandon(reason: "stale" | "closing"): void {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const { controller } of this.active.values()) controller.abort();
    if (reason === "stale")
      this.deps.onEvent({
        type: "stale",
        workflowId: this.id,
        generation: this.journal.recovery.workflowGeneration,
      });
    this.#resolve({ workflowId: this.id, status: null, summary: null, resultId: null });
  }

  /** A foreground waiter takes the summary as its tool result: the completion sink is not told. */
  attachForeground(): void {
    this.#foreground = true;
  }

  /** Whether a foreground WorkflowStart waits on this run. */
  get waitedOn(): boolean {
    return this.#foreground;
  }

  /**
   * Ctrl+B: the background snapshot is published (awaited) before the foreground waiter is let go. A failed
   * or refused write is diagnosed and leaves the waiter attached.
   */
  async moveToBackground(): Promise<{ ok: true } | { ok: false; reason: string }> {
    if (!this.#foreground) return { ok: false, reason: "no foreground waiter is attached" };
    if (this.#background) return { ok: true };
    if (this.#stopped || this.#finishing) return { ok: false, reason: "the workflow is ending" };
    this.#background = true;
    try {
      const result = await this.publish();
      if (result.status === "stale") throw new Error("the background snapshot was refused (stale)");
    } catch (e) {
      this.#background = false;
      const error = toError(e);
      this.deps.onEvent({ type: "background_failed", workflowId: this.id, error });
      return { ok: false, reason: error.message };
    }
    this.#foreground = false;
    this.#released();
    return { ok: true };
  }

  #lost(e: unknown): void {
    if (this.#stopped) return;
    this.deps.onEvent({ type: "run_lost", workflowId: this.id, error: toError(e) });
    this.abandon("closing");
  }

  /**
   * Writes the current journal; false (and the run stops) when the lease or generation moved on. Group
   * commit: while one write is in flight, every persist asked meanwhile joins the single next write, which
   * takes the journal as it is when it starts (a state the run passed through, newer than each joiner's),
   * so each caller still resolves only after a commit that holds its state, and parallel nodes share one.
   */
  persist(): Promise<boolean> {
    const generation = this.journal.recovery.workflowGeneration;
    const next = this.#nextWrite;
    if (next && next.generation === generation) return next.written;
    const write = { generation, written: Promise.resolve(false) };
    this.#nextWrite = write;
    write.written = this.#writes = this.#writes.then(async (ok) => {
      if (this.#nextWrite === write) this.#nextWrite = undefined;
      if (!ok || this.#stopped) return false;
      const next = this.#changes.next(this.journal);
      const { written, cancelRequested } = await this.deps.store.writeJournalText(
        this.id,
        next.write,
        generation,
        this.deps.owner,
      );
      if (!written) this.abandon("stale");
      // A Stop recorded by another process: honoured here, as this process's own.
      else if (cancelRequested && !this.journal.cancelRequested) queueMicrotask(() => void this.cancel());
      if (written) next.committed();
      return written;
    });
    return write.written;
  }

  snapshotOf(status: WorkflowStatus): WorkflowSnapshot {
    return {
      workflowId: this.id,
      name: this.journal.name,
      status,
      ...(this.#background ? { background: true as const } : {}),
      run: this.journal.run,
      nodes: this.journal.order.map((id) => {
        const n = this.journal.nodes[id] as NodeState;
        return {
          id,
          status: n.status,
          ...(n.childSessionId ? { childSessionId: n.childSessionId } : {}),
          ...(n.error ? { error: n.error.message } : {}),
        };
      }),
    };
  }

  /** Queues a snapshot; its expected generation is the one current now, when queued. */
  publish(status: WorkflowStatus = "running"): Promise<WorkflowEmitResult> {
    const expected = this.journal.recovery.workflowGeneration;
    // snapshotOf builds new objects of primitives only: handed over, not copied again.
    const result = this.deps.publisher.queue(
      { workflowId: this.id, status, snapshot: this.snapshotOf(status), owner: this.deps.owner },
      expected,
      true,
    );
    return result.then((r) => {
      if (r.status === "stale") this.abandon("stale");
      return r;
    });
  }

  #setStatus(id: string, status: NodeState["status"], patch: Partial<NodeState> = {}): void {
    const n = this.journal.nodes[id] as NodeState;
    Object.assign(n, patch, { status });
    this.#changes.changed(id);
    if (TERMINAL_NODE_STATUSES.has(status)) this.#readiness.ended(id);
    this.deps.onEvent({ type: "node", workflowId: this.id, nodeId: id, status });
  }

  /**
   * Pending nodes among `ids` whose dependency ended without success become blocked, and so on through
   * their dependents. Returns every node it looked at.
   */
  #blockDependents(ids: string[]): string[] {
    const looked = [...ids];
    for (let batch = ids; batch.length > 0; batch = this.#readiness.take(this.journal, false)) {
      for (const id of batch) {
        const n = this.journal.nodes[id] as NodeState;
        if (n.status !== "pending") continue;
        const bad = n.spec.dependsOn.find((d) => {
          const s = this.journal.nodes[d]?.status;
          return s !== undefined && s !== "succeeded" && TERMINAL_NODE_STATUSES.has(s);
        });
        if (bad === undefined) continue;
        this.#setStatus(id, "blocked", {
          error: {
            code: "dependency_failed",
            message: `dependency ${bad} ${this.journal.nodes[bad]?.status}`,
          },
        });
      }
      if (batch !== ids) looked.push(...batch);
    }
    return looked;
  }

  /** Launches every ready node, or finishes the workflow when every node is terminal. */
  pump(): void {
    if (this.#stopped || this.#finishing || this.journal.cancelRequested) return;
    const j = this.journal;
    const looked = this.#blockDependents(this.#readiness.take(j, this.active.size === 0));
    const ready = [...new Set(looked)].filter((id) => {
      const n = j.nodes[id] as NodeState;
      return n.status === "pending" && n.spec.dependsOn.every((d) => j.nodes[d]?.status === "succeeded");
    });
    for (const [i, id] of ready.entries()) {
      if (this.launch(id, "fresh")) continue;
      this.#readiness.requeue(ready.slice(i));
      break;
    }
    if (!this.#readiness.open(j) && this.active.size === 0) void this.finish().catch((e) => this.#lost(e));
  }

  /** Starts executing a node; false when the engine's node cap holds a fresh dispatch back. */
  launch(id: string, mode: Mode): boolean {
    if (this.active.has(id)) return true;
    const slots = this.deps.slots;
    if (slots && !slots.acquire(this, mode !== "fresh")) return false;
    const controller = new AbortController();
    if (mode === "fresh") {
      // Reserved synchronously: a second pump cannot launch the same node.
      (this.journal.nodes[id] as NodeState).status = "reserved";
      this.#changes.changed(id);
    }
    const done = this.#execute(id, mode, controller)
      .catch((e) => this.#lost(e))
      .finally(() => {
        this.active.delete(id);
        slots?.release();
        this.pump();
      });
    this.active.set(id, { controller, done });
    return true;
  }

  async #execute(id: string, mode: Mode, controller: AbortController): Promise<void> {
    const j = this.journal;
    const state = j.nodes[id] as NodeState;
    const node = state.spec;
    let admissionRefused = false;
    try {
      if (mode === "fresh") {
        // Fresh reservation: journaled and snapshotted before any asynchronous preparation; charged once.
        j.dispatches += 1;
        this.#setStatus(id, "reserved", { run: j.run, plannedChildId: randomUUID() });
        if (j.dispatches > j.definition.maxDispatches) {
          this.#setStatus(id, "failed", {
            error: {
              code: "dispatch_budget_exhausted",
              message: `the workflow may dispatch at most ${j.definition.maxDispatches} nodes`,
            },
          });
          await this.persist();
          await this.publish();
          return;
        }
        if (!(await this.persist())) return;
        if ((await this.publish()).status === "stale") return;
        workflowFault("node.reserved");
      }
      if (mode === "fresh" || mode === "prepare") {
        if (this.#cancelledBeforeStart(id)) return;
        if (state.plannedChildId === undefined) {
          // A reservation journaled before planned ids existed: plan (and journal) one before any insert.
          state.plannedChildId = randomUUID();
          this.#changes.changed(id);
          if (!(await this.persist())) return;
        }
        const { model, scope } = await this.#prepare(id, node, state.addedBy);
        if (this.#stopped) return;
        if (this.#cancelledBeforeStart(id)) return;
        const childSessionId = await this.deps.dispatcher.createChild({
          workflowId: j.workflowId,
          nodeId: id,
          parentSessionId: j.parentSessionId,
          principalAccountId: j.principalAccountId,
          model,
          scope,
          childSessionId: state.plannedChildId,
        });
        workflowFault("node.child_inserted");
        await rememberNodeWorktree(j, id, childSessionId, this.deps.isolation ?? null);
        this.#setStatus(id, "running", { childSessionId });
        if (!(await this.persist())) return;
        workflowFault("node.child_created");
        await this.#grantDependencies(id, childSessionId);
        if (this.#cancelledBeforeStart(id)) return;
        this.started.add(id);
        const result = await this.deps.dispatcher.runNode({
          workflowId: j.workflowId,
          nodeId: id,
          childSessionId,
          principalAccountId: j.principalAccountId,
          model,
          scope,
          prompt: nodePrompt(j, node),
          signal: controller.signal,
          onEvent: this.#progress(id),
        });
        await this.#settle(id, result);
        return;
      }
      // continue (boot) or retry (explicit resume): the same child, never a second one.
      const childSessionId = state.childSessionId as string;
      // A boot continuation finds the node running in its journal already: writing the same state again
      // would only fence, and the protected scope's assertion below reads the native row's lease and
      // generation before anything is dispatched.
      const journaled = mode === "continue" && state.status === "running";
      this.#setStatus(id, "running");
      if (!journaled && !(await this.persist())) return;
      this.started.add(id);
      const continueNode: RecoveryContinueNode =
        (mode === "retry" ? null : this.deps.recoveryContinue) ??
        ((input, host) => this.deps.dispatcher.continueNode(input, host));
      // Host-only arguments stay out of the input: startFresh only on the daemon-local recovery path.
      const host: NodeRecoveryHost =
        mode === "retry" ? {} : { startFresh: async () => nodePrompt(this.journal, node) };
      const input = {
        workflowId: j.workflowId,
        nodeId: id,
        childSessionId,
        parentSessionId: j.parentSessionId,
        principalAccountId: j.principalAccountId,
        model: ownEntry(j.nodeModels, id) ?? this.deps.defaultModel,
        scope: ownEntry(j.nodeAccess, id) ?? "",
        ...(mode === "retry" ? { fallbackPrompt: nodePrompt(j, node) } : {}),
        signal: controller.signal,
        onEvent: this.#progress(id),
      };
      let result: NodeRunResult;
      if (mode === "retry") {
        // The live caller (explicit WorkflowResume): no protected scope, no fresh callback.
        result = await continueNode(input, host);
      } else {
        // Automatic missing-child recovery (boot continuation): the host-only protected scope names this
        // exact child. Its assertion (exact admission) is awaited here first, before the dispatcher
        // prepares anything (transcript, startFresh's handovers and artifact address, the turn), and again
        // by a placement that matches the child.
        const scope = this.#protectedScope(id, childSessionId);
        try {
          await scope.assertDispatch(childSessionId);
        } catch (e) {
          admissionRefused = true;
          throw e;
        }
        result = await runWithWorkflowNodeDispatch(scope, () => continueNode(input, host));
      }
      await this.#settle(id, result);
    } catch (e) {
      if (this.#stopped || (j.cancelRequested && TERMINAL_NODE_STATUSES.has(state.status))) return;
      const error = toError(e);
      this.deps.onEvent({ type: "node_error", workflowId: this.id, nodeId: id, error });
      // A refused assertion of a boot continuation: another admission superseded this run; it stops
      // driving the workflow and writes nothing (the rows stay for their current owner).
      if (admissionRefused) throw error;
      const raw = (error as { code?: unknown }).code;
      const code = typeof raw === "string" ? raw : "node_error";
      this.#setStatus(id, "failed", { error: journaledError(code, error.message) });
      await this.persist();
      await this.publish();
    }
  }

  /**
   * The host-only `HostWorkflowNodeDispatch` of one automatic continuation: the workflow's parent, its
   * channel (crw's channel of a delegated child is its parent session) and the exact child. The assertion
   * checks exact admission: the child is the node's journaled child, the run is live and not stopped, the
   * generation and admission version are still the ones it was admitted under in the journal, the native
   * row (read from PostgreSQL) is running, held by this owner, at that generation and at no newer
   * admission version.
   */
  #protectedScope(
    id: string,
    childSessionId: string,
  ): HostWorkflowNodeDispatch & { assertDispatch: (child: string) => Promise<void> } {
    const j = this.journal;
    const admitted = { ...j.recovery };
    const refuse = (why: string): never => {
      throw new WorkflowStateError(
        "stale_generation",
        `node ${id}: its continuation is no longer admitted (${why})`,
        { workflowId: j.workflowId, nodeId: id },
      );
    };
    return {
      parentSessionId: j.parentSessionId,
      channelId: j.parentSessionId,
      childSessionId,
      assertDispatch: async (child: string) => {
        const state = j.nodes[id] as NodeState;
        if (child !== childSessionId || state.childSessionId !== child)
          throw new WorkflowStateError("child_mismatch", `node ${id}: ${child} is not its child`, {
            workflowId: j.workflowId,
            nodeId: id,
          });
        if (this.#stopped || j.cancelRequested) refuse("the run stopped");
        if (
          j.recovery.workflowGeneration !== admitted.workflowGeneration ||
          j.recovery.recoveryAdmissionVersion !== admitted.recoveryAdmissionVersion
        )
          refuse("the journal moved on");
        const row = await this.deps.store.currentWorkflow(j.workflowId);
        if (row?.cancelRequested && !j.cancelRequested) {
          // A Stop recorded by another process meanwhile: honoured here, as this process's own.
          queueMicrotask(() => void this.cancel());
          refuse("a Stop was recorded");
        }
        if (
          row?.status !== "running" ||
          row.lockedBy !== this.deps.owner ||
          row.recovery.workflowGeneration !== admitted.workflowGeneration ||
          // A row newer than the admission means another admission superseded this one.
          row.recovery.recoveryAdmissionVersion > admitted.recoveryAdmissionVersion
        )
          refuse("the native record moved on");
      },
    };
  }

  #progress(nodeId: string): (event: NodeEvent) => void {
    return (event) => this.deps.onEvent({ type: "node_progress", workflowId: this.id, nodeId, event });
  }

  #cancelledBeforeStart(id: string): boolean {
    if (!this.journal.cancelRequested) return false;
    const n = this.journal.nodes[id] as NodeState;
    if (n.status !== "cancelled") this.#setStatus(id, "cancelled");
    return true;
  }

  async #prepare(
    id: string,
    node: WorkflowNode,
    addedBy: string | undefined,
  ): Promise<{ model: string; scope: string }> {
    const j = this.journal;
    try {
      let model = node.model;
      if (model === undefined && node.agentType !== undefined) {
        model = ownEntry(j.typeModelPins, node.agentType);
        if (model === undefined) {
          model = this.deps.defaultModel;
          j.typeModelPins[node.agentType] = model;
        }
      }
      model ??= this.deps.defaultModel;
      let placement = null;
      if (node.cwd !== undefined) {
        if (!this.deps.workDirPolicy) {
          throw Object.assign(new Error("this host cannot place a node in a working directory"), {
            code: "work_dir_not_permitted",
          });
        }
        const base = j.origin.cwd ?? "/";
        const cwd = this.deps.workDirPolicy.kind === "local" ? node.cwd : resolvePath(base, node.cwd);
        placement = await delegatedWorkDir(cwd, this.deps.workDirPolicy);
        await this.deps.admitNodeWorkDir?.(placement);
      }
      let placed: WorkDirPlacement | null =
        placement ??
        (j.origin.cwd
          ? {
              workDir: j.origin.cwd,
              target: j.origin.access.target as never,
              projectRef: j.origin.access.projectRef,
              instructionRoot: null,
            }
          : null);
      if (node.isolation === "worktree") {
        if (!this.deps.workDirPolicy)
          throw Object.assign(new Error("this host cannot place a node in a working directory"), {
            code: "work_dir_not_permitted",
          });
        const planned = (j.nodes[id] as NodeState).plannedChildId ?? randomUUID();
        placed = await isolateNode(
          j,
          id,
          node,
          placed,
          this.deps.workDirPolicy,
          this.deps.isolation ?? null,
          planned,
        );
        await this.deps.admitNodeWorkDir?.(placed);
      }
      const scope = captureNodeScope(j, node, addedBy, placed);
      j.nodeModels[id] = model;
      j.nodeAccess[id] = scope;
      // With its worktree (isolateNode) and any new type pin: all journaled by the node's next write.
      this.#changes.changed(id);
      return { model, scope };
    } catch (e) {
      throw Object.assign(
        new WorkflowNodePreparationError(
          `node ${id} could not be prepared: ${toError(e).message}`,
          { workflowId: j.workflowId, nodeId: id },
          { cause: e },
        ),
        {
          code:
            typeof (e as { code?: unknown }).code === "string"
              ? (e as { code: string }).code
              : "node_preparation_failed",
        },
      );
    }
  }

  /** Grants minted from the journal's stored dependency ids and hashes; no caller-supplied path mints one. */
  async #grantDependencies(id: string, childSessionId: string): Promise<void> {
    const artifacts = this.deps.artifacts;
    if (!artifacts) return;
    const node = (this.journal.nodes[id] as NodeState).spec;
    const wanted = node.dependsOn.flatMap((dep) => {
      const artifact = this.journal.nodes[dep]?.artifact;
      return artifact ? [{ nodeId: dep, sha256: artifact.sha256 }] : [];
    });
    const granted = await artifacts.grantMany(this.id, wanted, childSessionId);
    const missing = wanted.find((w) => !granted.has(w.nodeId));
    if (missing) {
      throw new WorkflowNodePreparationError(
        `the artifact of ${missing.nodeId} is not stored`,
        { workflowId: this.id, nodeId: id },
        { cause: new Error(`no artifact ${missing.nodeId}@${missing.sha256}`) },
      );
    }
  }

  async #settle(id: string, result: NodeRunResult): Promise<void> {
    if (this.#stopped) return;
    workflowFault("node.settling");
    const j = this.journal;
    // After a cancel, the summary already says what this node was; a late answer changes nothing.
    if (j.cancelRequested && TERMINAL_NODE_STATUSES.has((j.nodes[id] as NodeState).status)) return;
    switch (result.status) {
      case "answered":
      case "continued": {
        const node = (j.nodes[id] as NodeState).spec;
        const invalid = node.outputSchema ? outputSchemaProblem(node.outputSchema, result.reply) : undefined;
        if (invalid) {
          this.#setStatus(id, "failed", { error: { code: "output_schema", message: invalid } });
          break;
        }
        const state = j.nodes[id] as NodeState;
        let kept: string;
        try {
          kept = await commitNodeWork(j, id, state.childSessionId, this.deps.isolation ?? null);
        } catch (e) {
          // Work that could not be committed would be lost to its dependents and to landing: the node fails.
          this.#setStatus(id, "failed", {
            error: {
              code: "worktree_commit_failed",
              message: `its worktree could not be committed: ${toError(e).message}`,
            },
          });
          break;
        }
        const artifacts = this.deps.artifacts;
        // Stored with the parent's grant of that version, in one commit.
        const artifact = artifacts
          ? await artifacts.putArtifactGranted(
              this.id,
              id,
              // A typed (output-schema) answer stays exactly the JSON its dependents parse.
              node.outputSchema ? result.reply : artifactContent(result.reply, result.outputs),
              j.parentSessionId,
            )
          : undefined;
        this.#setStatus(id, "succeeded", {
          handover: handoverOf(`${result.reply}${kept}`),
          ...(artifact ? { artifact } : {}),
        });
        break;
      }
      case "empty":
        this.#setStatus(id, "failed", {
          error: {
            code: "empty_continuation",
            message: "the node's child had no transcript to continue and no task was given",
          },
        });
        break;
      case "failed":
        this.#setStatus(id, "failed", { error: journaledError(result.error.code, result.error.message) });
        break;
      case "aborted":
        if (j.cancelRequested) this.#setStatus(id, "interrupted");
        else return; // the process is letting go of the workflow: the running node stays running in the journal
        break;
    }
    // Dependents made ready (or blocked) by this outcome are reserved now, so their reservations ride the
    // same journal write and snapshot as the outcome; each one still prepares only after that snapshot is
    // published, so results (artifact, grants, handover) reach dependents only after their publication.
    this.pump();
    if (!(await this.persist())) return;
    await this.publish();
  }

  /** Cancel: running nodes are interrupted, nodes that never started are cancelled; then the summary. */
  cancel(): Promise<WorkflowOutcome> {
    if (this.#stopped || this.#finishing) return this.finished;
    this.journal.cancelRequested = true;
    for (const id of this.journal.order) {
      const n = this.journal.nodes[id] as NodeState;
      if (n.status === "pending" || (n.status === "reserved" && !this.started.has(id)))
        this.#setStatus(id, "cancelled");
      else if (n.status === "running" && (this.started.has(id) || this.rebuilt))
        this.#setStatus(id, "interrupted");
      else if (n.status === "running") this.#setStatus(id, "cancelled");
    }
    for (const { controller } of this.active.values()) controller.abort();
    void this.finish().catch((e) => this.#lost(e));
    return this.finished;
  }

  async finish(): Promise<void> {
    if (this.#finishing || this.#stopped) return;
    this.#finishing = true;
    const j = this.journal;
    const cancelled = j.cancelRequested;
    const failed = j.order.some((id) => j.nodes[id]?.status !== "succeeded");
    const status: WorkflowStatus = cancelled ? "cancelled" : failed ? "failed" : "completed";
    // A cancellation starts its summary before awaiting pending publication.
    let summary = cancelled ? workflowSummary(j, "was cancelled") : null;
    await Promise.allSettled([...this.active.values()].map((a) => a.done));
    // Usually the last node's outcome write holds the final journal already: no second write of it. The
    // terminal publication and the summary handoff below are fenced by generation (and lease) themselves.
    if (this.#changes.pending(j) && !(await this.persist())) return;
    await this.deps.publisher.drain();
    if (this.#stopped) return;
    const terminal = await this.publish(status);
    if (terminal.status === "stale") return;
    workflowFault("workflow.terminal_published");
    summary ??= workflowSummary(j, status === "completed" ? "completed" : "failed", this.#note);
    await this.#deliver(status, summary);
  }

  /** Boot, after a terminal publication whose summary had not reached the inbox: hand it over now. */
  async finishDelivery(status: WorkflowStatus): Promise<void> {
    this.#finishing = true;
    const j = this.journal;
    await this.#deliver(
      status,
      workflowSummary(
        j,
        status === "completed" ? "completed" : status === "cancelled" ? "was cancelled" : "failed",
      ),
    );
  }

  /** Ends the whole workflow as failed without starting anything (a boot whose boundary check refused). */
  async failWhole(reason: string): Promise<void> {
    this.#note = reason;
    for (const id of this.journal.order) {
      const n = this.journal.nodes[id] as NodeState;
      if (!TERMINAL_NODE_STATUSES.has(n.status))
        this.#setStatus(id, "failed", { error: { code: "resume_refused", message: reason } });
    }
    await this.finish();
  }

  async #deliver(status: WorkflowStatus, summary: string): Promise<void> {
    const j = this.journal;
    const outcome = status === "completed" ? "ok" : "error";
    const writer = this.#bindings?.writer ?? this.deps.summaryWriter;
    const prepared = writer
      ? await writer(summary, outcome, this.id)
      : { body: summary, byteSize: Buffer.byteLength(summary) };
    const delivered = await this.deps.store.deliverSummary({
      workflowId: this.id,
      generation: j.recovery.workflowGeneration,
      resultId: j.summaryResultId,
      outcome,
      body: prepared.body,
      byteSize: prepared.byteSize,
      ...(prepared.spillId ? { spillId: prepared.spillId } : {}),
      ...(j.summaryToolCallId ? { toolCallId: j.summaryToolCallId } : {}),
      keepJournal: status !== "completed",
    });
    if (delivered === null) {
      this.abandon("stale");
      return;
    }
    const completion = {
      workflowId: this.id,
      parentSessionId: j.parentSessionId,
      principalAccountId: j.principalAccountId,
      resultId: delivered,
      status,
    };
    // The origin's own completion sink when it bound one; the engine's (the boot path's) otherwise.
    const sink = this.#bindings?.completion;
    if (this.#foreground) {
      // The foreground tool call returns the summary (its result acknowledges it); nobody else is told.
    } else if (sink) await sink(completion);
    else await this.deps.onCompletion(completion);
    await this.deps.store.releaseWorkflow(this.id, this.deps.owner);
    this.#stopped = true;
    this.deps.onEvent({ type: "workflow", workflowId: this.id, status, resultId: delivered });
    this.#resolve({ workflowId: this.id, status, summary, resultId: delivered });
  }
}

/** The node's full answer, then every tool output its child's context referenced (for dependents to read). */
export function artifactContent(reply: string, outputs: readonly NodeOutputReference[] | undefined): string {
  if (!outputs || outputs.length === 0) return reply;
  const lines = outputs.map((o) => {
    const parts = [o.toolName];
    if (o.toolCallId) parts.push(`call ${o.toolCallId}`);
    if (o.resultId) parts.push(`result ${o.resultId}`);
    if (o.childSessionId) parts.push(`child ${o.childSessionId}`);
    if (o.spillPath) parts.push(`output ${o.spillPath}`);
    if (o.byteSize !== undefined) parts.push(`${o.byteSize} bytes`);
    if (o.isError) parts.push("error");
    return `- ${parts.join(", ")}`;
  });
  return `${reply}\n\n## Tool outputs referenced by this node\n${lines.join("\n")}\n`;
}
