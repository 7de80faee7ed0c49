import { createHash, randomUUID } from "node:crypto";
import type { WorkDirPlacement, WorkDirPolicy } from "@crw/brain";
import {
  type ChannelListener,
  type DelegationRepository,
  listenForWorkflowCancels,
  PgDelegationRepository,
} from "@crw/db";
import type pg from "pg";
import type { ProjectFileReader } from "../definition/reader.js";
import { definitionFormat } from "../definition/reader.js";
import { DEFINITION_LIMITS, type WorkflowDefinition } from "../definition/schema.js";
import { parseWorkflowDefinition, validateAddedNodes } from "../definition/validate.js";
import { WorkflowBoundaryError, WorkflowStateError } from "../errors.js";
import { type NodeState, type OrchestrationJournal, readOrchestrationJournal } from "../journal/schema.js";
import { PgArtifactStore } from "../store/artifacts.js";
import { PgWorkflowStore, type WorkflowRow } from "../store/native.js";
import {
  authorityOf,
  boundaryAgainst,
  currentDelegatedAccess,
  normalizeOriginAccess,
  type OriginAccessInput,
  originScope,
  type ValidateBoundary,
} from "./access.js";
import { captureOriginBindings, type SummaryWriter, type WorkflowHostAccessors } from "./context.js";
import type { NodeDispatcher, RecoveryContinueNode } from "./dispatch.js";
import { type LandedNode, landWorkflowNodes } from "./isolation.js";
import { ownEntry } from "./own.js";
import { pgWorkflowEmitter, SnapshotPublisher, type WorkflowEmitter } from "./publication.js";
import { NodeSlots, type WorkflowEvent, type WorkflowOutcome, WorkflowRun } from "./run.js";

export interface WorkflowEngineOptions {
  readonly pool: pg.Pool;
  /** This process's owner id: its liveness is the advisory owner lease it holds while open. */
  readonly owner: string;
  readonly dispatcher: NodeDispatcher;
  readonly defaultModel: string;
  /** The host's awaited publication; defaults to the native record in PostgreSQL. */
  readonly emitter?: WorkflowEmitter;
  /** The child's live placement policy for node `cwd`s (delegatedWorkDir); null refuses node cwds. */
  readonly workDirPolicy?: (ctx: {
    principalAccountId: string;
    parentSessionId: string;
  }) => Promise<WorkDirPolicy | null>;
  /** Where isolated nodes' git worktrees are made (one directory each); absent refuses node isolation. */
  readonly worktreesDir?: string;
  /** The host's last word on a node's placement (a node never leaves its session's project); throws to refuse. */
  readonly admitNodeWorkDir?: (
    ctx: { principalAccountId: string; parentSessionId: string },
    placement: WorkDirPlacement,
  ) => Promise<void>;
  /** The delegationCompletionEmitter: told after the summary is in the parent's inbox (null: nobody). */
  readonly onCompletion?: (completion: {
    workflowId: string;
    parentSessionId: string;
    principalAccountId: string;
    resultId: string;
    status: string;
  }) => Promise<void>;
  readonly onEvent?: (event: WorkflowEvent) => void;
  readonly repo?: DelegationRepository;
  /**
   * The plugin's cap on nodes executing at once across every workflow of this engine (applies on top of
   * the runner pool's own queue): a ready node beyond it stays pending until a slot frees. Default: none.
   */
  readonly maxActiveNodes?: number;
  /**
   * false: a minimal composition without shared result artifacts. Dependents get handovers only; no
   * artifact is stored and no grant is minted. Default true.
   */
  readonly sharedArtifacts?: boolean;
  /** Listen (one dedicated connection) for Stops recorded by other processes, for a prompt cancel. */
  readonly listenForCancel?: boolean;
  /** The summary writer for workflows finished without a live origin context (boot recovery). */
  readonly summaryWriter?: (ctx: {
    parentSessionId: string;
    principalAccountId: string;
  }) => SummaryWriter | null;
}

/** The live origin turn of a WorkflowStart or WorkflowResume call. */
export interface WorkflowCallContext extends WorkflowHostAccessors {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  /** The origin turn's current access, awaited on start and again on explicit resume. */
  currentAccess(): Promise<OriginAccessInput>;
  /** The origin turn's working directory, awaited before placement is stored. */
  currentWorkDir(): Promise<string | null>;
}

export interface StartedWorkflow {
  readonly workflowId: string;
  readonly nodes: readonly string[];
  /** false when this tool call had already started it (a retried call starts nothing new). */
  readonly created: boolean;
}

/**
 * The workflow DAG engine: WorkflowStart, WorkflowAddNodes, cancel, explicit WorkflowResume and boot
 * recovery. Several daemons may share one database: a workflow is driven by the process
 * that holds its row lease, and a dead owner's workflows are claimed at boot with `for update skip locked`.
 */
export class WorkflowEngine {
  readonly store: PgWorkflowStore;
  readonly artifacts: PgArtifactStore;
  readonly #runs = new Map<string, WorkflowRun>();
  /** Claimed workflows a recovery pass is resuming now (not tracked in #runs yet). */
  readonly #recovering = new Set<string>();
  readonly #emitter: WorkflowEmitter;
  readonly #repo: DelegationRepository;
  readonly #slots: NodeSlots | null;
  #releaseOwner: (() => Promise<void>) | undefined;
  #listener: ChannelListener | undefined;

  constructor(private readonly options: WorkflowEngineOptions) {
    this.store = new PgWorkflowStore(options.pool);
    this.artifacts = new PgArtifactStore(options.pool);
    this.#emitter = options.emitter ?? pgWorkflowEmitter(this.store);
    this.#repo = options.repo ?? new PgDelegationRepository(options.pool);
    const cap = options.maxActiveNodes;
    if (cap !== undefined && (!Number.isInteger(cap) || cap < 1)) {
      throw new RangeError(`maxActiveNodes must be a positive integer (got ${cap})`);
    }
    this.#slots = cap === undefined ? null : new NodeSlots(cap);
  }

  /** Nodes executing in this engine right now (every workflow), as the node cap counts them. */
  activeNodes(): number {
    let n = 0;
    for (const run of this.#runs.values()) n += run.active.size;
    return n;
  }

  /** Holds the owner lease: until `close`, other processes leave this owner's workflows alone. */
  async open(): Promise<void> {
    this.#releaseOwner ??= await this.#repo.holdOwnerLease(this.options.owner);
    if (this.options.listenForCancel && !this.#listener) {
      this.#listener = await listenForWorkflowCancels(this.options.pool, (workflowId) => {
        const run = this.#runs.get(workflowId);
        if (run && !run.journal.cancelRequested) void run.cancel();
      });
    }
  }

  /**
   * Stops driving every workflow in this process without writing anything (their journals stay as they
   * are, for another process or the next boot) and lets go of the owner lease.
   */
  async close(): Promise<void> {
    for (const run of this.#runs.values()) run.abandon("closing");
    await Promise.allSettled(
      [...this.#runs.values()].flatMap((r) => [...r.active.values()].map((a) => a.done)),
    );
    this.#runs.clear();
    const listener = this.#listener;
    this.#listener = undefined;
    await listener?.close();
    const release = this.#releaseOwner;
    this.#releaseOwner = undefined;
    await release?.();
  }

  /** The running node whose child is `sessionId`, among the workflows this process drives. */
  nodeOfSession(sessionId: string): { workflowId: string; nodeId: string } | undefined {
    for (const run of this.#runs.values()) {
      for (const id of run.journal.order) {
        const n = run.journal.nodes[id];
        if (n?.childSessionId === sessionId && n.status === "running")
          return { workflowId: run.id, nodeId: id };
      }
    }
    return undefined;
  }

  /** Workflows driven by this process right now. */
  runIds(): string[] {
    return [...this.#runs.keys()];
  }

  run(workflowId: string): WorkflowRun | undefined {
    return this.#runs.get(workflowId);
  }

  /**
   * The outcome of a workflow driven here (resolves when its summary is in the parent's inbox); for one that
   * already ended (also one that ended here before the caller asked), what its native record says, with
   * the summary as its delivered result carries it (the spill placeholder when it was spilled).
   */
  async finished(workflowId: string): Promise<WorkflowOutcome> {
    const run = this.#runs.get(workflowId);
    if (run) return run.finished;
    const row = await this.store.getWorkflow(workflowId);
    if (row && row.status !== "running" && row.summaryResultId !== null) {
      const delivered = await this.#repo.getResult(row.summaryResultId, row.principalAccountId);
      return { workflowId, status: row.status, summary: delivered.body, resultId: row.summaryResultId };
    }
    throw new WorkflowStateError("not_running", `workflow ${workflowId} is not running in this process`, {
      workflowId,
    });
  }

  async #deps(
    journal: { principalAccountId: string; parentSessionId: string },
    recoveryContinue: RecoveryContinueNode | null = null,
  ) {
    const policy = (await this.options.workDirPolicy?.(journal)) ?? null;
    return {
      slots: this.#slots,
      recoveryContinue,
      owner: this.options.owner,
      store: this.store,
      artifacts: this.options.sharedArtifacts === false ? null : this.artifacts,
      dispatcher: this.options.dispatcher,
      publisher: new SnapshotPublisher(this.#emitter),
      defaultModel: this.options.defaultModel,
      workDirPolicy: policy,
      isolation: this.options.worktreesDir ? { dir: this.options.worktreesDir, repo: this.#repo } : null,
      admitNodeWorkDir: async (placement: WorkDirPlacement) => {
        await this.options.admitNodeWorkDir?.(journal, placement);
      },
      onEvent: (e: WorkflowEvent) => this.options.onEvent?.(e),
      onCompletion: async (c: Parameters<NonNullable<WorkflowEngineOptions["onCompletion"]>>[0]) => {
        await this.options.onCompletion?.(c);
      },
      summaryWriter: this.options.summaryWriter?.(journal) ?? null,
    };
  }

  #track(run: WorkflowRun): void {
    this.#runs.set(run.id, run);
    void run.finished.then(() => {
      if (this.#runs.get(run.id) === run) this.#runs.delete(run.id);
    });
  }

  /**
   * WorkflowStart: reads the definition through the bounded, version-pinned reader, validates it whole
   * (nothing is created for a refused one), awaits the origin's access and cwd, then awaits the created
   * publication and journals its recovery proof before preparing any node.
   */
  async start(
    ctx: WorkflowCallContext,
    source: { path: string; reader: ProjectFileReader } | { definition: WorkflowDefinition },
  ): Promise<StartedWorkflow> {
    let definition: WorkflowDefinition;
    let path: string | null = null;
    let version: string;
    if ("definition" in source) {
      definition = source.definition;
      version = createHash("sha256").update(JSON.stringify(definition)).digest("hex");
    } else {
      const file = await source.reader.readProjectFile(source.path);
      definition = parseWorkflowDefinition(file.text, definitionFormat(file.path), source.path);
      path = file.path;
      version = file.version;
    }
    const access = normalizeOriginAccess(await ctx.currentAccess());
    if (access.accountId !== ctx.principalAccountId) {
      throw new WorkflowStateError("not_resumable", "the origin's access names another account", {});
    }
    const cwd = await ctx.currentWorkDir();
    const bindings = await captureOriginBindings(ctx);
    const workflowId = randomUUID();
    const journal: OrchestrationJournal = {
      version: 2,
      workflowId,
      name: definition.name,
      parentSessionId: ctx.parentSessionId,
      principalAccountId: ctx.principalAccountId,
      toolCallId: ctx.toolCallId,
      // A fresh native insert is generation 1; the created receipt's proof replaces this before any node work.
      recovery: { workflowGeneration: 1, recoveryAdmissionVersion: 1 },
      run: 1,
      definition: {
        path,
        version,
        maxDispatches: definition.maxDispatches ?? definition.nodes.length * 4 + 100,
      },
      origin: { access, cwd },
      order: definition.nodes.map((n) => n.id),
      nodes: Object.fromEntries(
        definition.nodes.map((spec) => [spec.id, { spec, status: "pending" } satisfies NodeState]),
      ),
      nodeAccess: {},
      nodeModels: {},
      typeModelPins: {
        ...(definition.defaults.model && definition.defaults.agentType
          ? { [definition.defaults.agentType]: definition.defaults.model }
          : {}),
        ...Object.fromEntries(Object.entries(definition.agentTypes).map(([t, v]) => [t, v.model])),
      },
      dispatches: 0,
      cancelRequested: false,
      summaryResultId: randomUUID(),
      expansion: bindings.expansion,
    };
    if (definition.defaults.model) {
      for (const n of Object.values(journal.nodes))
        if (!n.spec.model && !n.spec.agentType) n.spec.model = definition.defaults.model;
    }
    if (definition.defaults.agentType) {
      for (const n of Object.values(journal.nodes)) n.spec.agentType ??= definition.defaults.agentType;
    }
    const deps = await this.#deps(journal);
    let adopt!: (ok: boolean) => void;
    const adopted = new Promise<boolean>((r) => {
      adopt = r;
    });
    const run = new WorkflowRun(
      journal,
      deps,
      adopted.then((ok) => (ok ? undefined : Promise.reject(new Error("not created")))),
    );
    run.bind(bindings);
    // Registered before the first receipt: a Stop that arrives now is queued behind it, under generation 1.
    this.#track(run);
    let created: Awaited<ReturnType<typeof deps.publisher.queue>>;
    try {
      created = await deps.publisher.queue(
        {
          workflowId,
          status: "running",
          snapshot: run.snapshotOf("running"),
          create: {
            parentSessionId: ctx.parentSessionId,
            principalAccountId: ctx.principalAccountId,
            toolCallId: ctx.toolCallId,
            owner: this.options.owner,
          },
        },
        undefined,
      );
    } catch (e) {
      adopt(false);
      run.abandon("closing");
      throw e;
    }
    if (created.status !== "created") {
      adopt(false);
      run.abandon("closing");
      throw new WorkflowStateError(
        "missing_recovery_proof",
        "the initial publication did not create the workflow",
        { workflowId },
      );
    }
    if (created.workflowId !== workflowId) {
      adopt(false);
      run.abandon("closing");
      const existing = await this.store.getWorkflow(created.workflowId, ctx.principalAccountId);
      const prior = existing
        ? readOrchestrationJournal(await this.store.readJournal(existing.id))
        : undefined;
      return { workflowId: created.workflowId, nodes: prior?.ok ? prior.journal.order : [], created: false };
    }
    journal.recovery = { ...created.recovery };
    adopt(true);
    if (!(await run.persist())) {
      throw new WorkflowStateError("lease_lost", "the workflow's journal could not be written", {
        workflowId,
      });
    }
    run.pump();
    return { workflowId, nodes: [...journal.order], created: true };
  }

  /**
   * WorkflowAddNodes: validated against the live graph (ids new, dependencies known, no cycle, bounded),
   * journaled and published before the added ids are reported. From a node, the caller must be that node's
   * own running child; added nodes inherit its stored access.
   */
  async addNodes(input: {
    workflowId: string;
    principalAccountId: string;
    fromNodeId?: string;
    callerSessionId?: string;
    nodes: unknown;
  }): Promise<string[]> {
    const run = this.#runs.get(input.workflowId);
    if (!run || run.stopped || run.journal.principalAccountId !== input.principalAccountId) {
      throw new WorkflowStateError("not_running", `workflow ${input.workflowId} is not running here`, {
        workflowId: input.workflowId,
      });
    }
    const j = run.journal;
    if (j.cancelRequested)
      throw new WorkflowStateError("not_running", "the workflow is being cancelled", {
        workflowId: j.workflowId,
      });
    if (input.fromNodeId !== undefined) {
      if (j.expansion === "none") {
        throw new WorkflowStateError(
          "expansion_unavailable",
          "nodes of this workflow run out of process without the expansion capability: they cannot add nodes",
          { workflowId: j.workflowId },
        );
      }
      const from = ownEntry(j.nodes, input.fromNodeId);
      if (
        from?.status !== "running" ||
        (input.callerSessionId !== undefined && from.childSessionId !== input.callerSessionId)
      ) {
        throw new WorkflowStateError(
          "node_not_running",
          `node ${input.fromNodeId} is not a running node of this workflow`,
          {
            workflowId: j.workflowId,
            nodeId: input.fromNodeId,
          },
        );
      }
    }
    const added = validateAddedNodes(
      j.order.map((id) => (j.nodes[id] as NodeState).spec),
      input.nodes,
      DEFINITION_LIMITS.nodes,
    );
    for (const spec of added) {
      j.nodes[spec.id] = {
        spec,
        status: "pending",
        ...(input.fromNodeId ? { addedBy: input.fromNodeId } : {}),
      };
      j.order.push(spec.id);
    }
    if (!(await run.persist()))
      throw new WorkflowStateError("lease_lost", "the workflow moved on", { workflowId: j.workflowId });
    const published = await run.publish();
    if (published.status === "stale")
      throw new WorkflowStateError("stale_generation", "the workflow moved on", { workflowId: j.workflowId });
    run.pump();
    return added.map((n) => n.id);
  }

  /**
   * A Stop for a workflow: this process's own run is cancelled at once; one driven by another process is
   * recorded for its owner (who cancels it and delivers the summary). `not_running`: nothing to stop.
   */
  async requestCancel(
    workflowId: string,
    principalAccountId: string,
  ): Promise<"cancelled" | "requested" | "not_running"> {
    const run = this.#runs.get(workflowId);
    if (run && run.journal.principalAccountId === principalAccountId) {
      await run.cancel();
      return "cancelled";
    }
    return (await this.store.requestCancel(workflowId, principalAccountId)) ? "requested" : "not_running";
  }

  /** Ctrl+B for a session: each workflow a foreground WorkflowStart of `parentSessionId` waits on here. */
  async moveForegroundOf(
    parentSessionId: string,
    principalAccountId: string,
  ): Promise<{ workflowId: string; moved: { ok: true } | { ok: false; reason: string } }[]> {
    const waited = [...this.#runs.values()].filter(
      (run) =>
        run.waitedOn &&
        run.journal.parentSessionId === parentSessionId &&
        run.journal.principalAccountId === principalAccountId,
    );
    return Promise.all(
      waited.map(async (run) => ({ workflowId: run.id, moved: await run.moveToBackground() })),
    );
  }

  /** Lands the workflow's isolated nodes' committed branches (see `landWorkflowNodes`). */
  land(workflowId: string, principalAccountId: string): Promise<LandedNode[]> {
    return landWorkflowNodes(this.#repo, workflowId, principalAccountId);
  }
  /** Stop: running nodes are interrupted and pending ones never start; one summary reaches the parent. */
  async cancel(workflowId: string, principalAccountId: string): Promise<WorkflowOutcome> {
    const run = this.#runs.get(workflowId);
    if (!run || run.journal.principalAccountId !== principalAccountId) {
      throw new WorkflowStateError("not_running", `workflow ${workflowId} is not running here`, {
        workflowId,
      });
    }
    return run.cancel();
  }

  /**
   * Explicit WorkflowResume: a new authorized request. Re-captures the origin's access and cwd, checks the
   * parent boundary and every node boundary (verbatim, listCovers) before any work, refusing the whole
   * resume on any rejection; then advances the workflow generation (older writers turn stale). Existing
   * children keep their placement; fresh nodes use the new target and cwd.
   */
  async resume(
    ctx: WorkflowCallContext,
    workflowId: string,
    validateBoundary?: ValidateBoundary,
  ): Promise<StartedWorkflow> {
    const row = await this.store.getWorkflow(workflowId, ctx.principalAccountId);
    if (!row || row.parentSessionId !== ctx.parentSessionId) {
      throw new WorkflowStateError(
        "workflow_not_found",
        `workflow ${workflowId} is not a workflow of this session`,
        { workflowId },
      );
    }
    if (row.status !== "failed" && row.status !== "cancelled") {
      throw new WorkflowStateError(
        "not_resumable",
        `workflow ${workflowId} is ${row.status}; only a failed or cancelled workflow resumes`,
        {
          workflowId,
          status: row.status,
        },
      );
    }
    const reading = readOrchestrationJournal(await this.store.readJournal(workflowId));
    if (!reading.ok)
      throw new WorkflowStateError(
        "invalid_journal",
        `workflow ${workflowId} cannot be resumed: ${reading.reason}`,
        { workflowId },
      );
    const journal = reading.journal;
    const access = normalizeOriginAccess(await ctx.currentAccess());
    const cwd = await ctx.currentWorkDir();
    const bindings = await captureOriginBindings(ctx);
    const check = validateBoundary ?? boundaryAgainst(authorityOf(access));
    const verdicts = [{ subject: "parent", scope: originScope(journal.origin.access) }];
    for (const id of journal.order) {
      const scope = ownEntry(journal.nodeAccess, id);
      if (scope !== undefined) verdicts.push({ subject: id, scope });
    }
    for (const v of verdicts) {
      const verdict = await check(v);
      if (!verdict.ok) {
        throw new WorkflowBoundaryError(
          `resume refused: the journaled access of ${v.subject === "parent" ? "the workflow" : `node ${v.subject}`} exceeds current access (${verdict.reason})`,
          { subject: v.subject, reason: verdict.reason },
        );
      }
    }
    const recovery = await this.store.advanceWorkflowGeneration({
      workflowId,
      toolCallId: row.toolCallId,
      principalAccountId: ctx.principalAccountId,
      owner: this.options.owner,
    });
    if (!recovery)
      throw new WorkflowStateError("not_resumable", `workflow ${workflowId} changed meanwhile`, {
        workflowId,
      });
    journal.recovery = recovery;
    journal.run += 1;
    journal.origin = { access, cwd };
    journal.cancelRequested = false;
    journal.summaryResultId = randomUUID();
    // The resumed run's summary answers this WorkflowResume call.
    journal.summaryToolCallId = ctx.toolCallId;
    journal.expansion = bindings.expansion;
    const retry: string[] = [];
    for (const id of journal.order) {
      const n = journal.nodes[id] as NodeState;
      if (n.status === "succeeded") continue;
      delete n.error;
      if (n.childSessionId && (n.status === "interrupted" || n.status === "failed")) {
        n.status = "running";
        retry.push(id);
      } else {
        // Fresh under the new boundary: placement and access are prepared again when it starts.
        n.status = "pending";
        delete n.childSessionId;
        delete journal.nodeAccess[id];
      }
    }
    const run = new WorkflowRun(journal, await this.#deps(journal));
    this.#track(run);
    if (!(await run.persist()))
      throw new WorkflowStateError("lease_lost", "the workflow moved on", { workflowId });
    if ((await run.publish()).status === "stale")
      throw new WorkflowStateError("stale_generation", "the workflow moved on", { workflowId });
    for (const id of retry) run.launch(id, "retry");
    run.pump();
    return { workflowId, nodes: [...journal.order], created: false };
  }

  /**
   * Boot recovery (and any later pass: call it again to adopt workflows of a daemon that died meanwhile):
   * claims workflows whose owner is gone and resumes each from its journal, adopting the
   * native record's generation and admission version (no reset, no dispatch budget charged). A node whose
   * child exists is continued in that child (never a second node for a lost runner). An invalid or
   * old-format journal terminalizes only its own workflow, with a report to its parent.
   */
  async recoverInterrupted(
    limit = 1000,
    hooks: {
      continueNode?: RecoveryContinueNode;
      /** A live takeover: only workflows leased by a dead owner are claimed (see claimInterrupted). */
      deadOwnersOnly?: boolean;
      /** Sees the claimed workflows not driven here yet, before any of them resumes. */
      claimed?: (rows: readonly WorkflowRow[]) => Promise<void>;
    } = {},
  ): Promise<{ resumed: string[]; invalid: string[]; refused: string[] }> {
    const claimed = await this.store.claimInterrupted(this.options.owner, limit, {
      deadOwnersOnly: hooks.deadOwnersOnly === true,
    });
    // Already driven here (a repeated pass), or being resumed by another pass of this process right now (a
    // boot pass and a takeover sweep overlap; both claim rows this owner leases): never a second run.
    const rows = claimed.filter((row) => !this.#runs.has(row.id) && !this.#recovering.has(row.id));
    for (const row of rows) this.#recovering.add(row.id);
    const out = { resumed: [] as string[], invalid: [] as string[], refused: [] as string[] };
    if (rows.length > 0 && hooks.claimed) {
      try {
        await hooks.claimed(rows);
      } catch (e) {
        // Nothing resumed: what this live process claimed goes back to the next sweep, not stranded here.
        for (const row of rows) this.#recovering.delete(row.id);
        await Promise.all(
          rows.map((r) => this.store.handBackWorkflow(r.id, this.options.owner).catch(() => undefined)),
        );
        throw e;
      }
    }
    const journalOf = this.#claimedJournals(rows);
    const outcomes: ("resumed" | "invalid" | "refused")[] = [];
    // A few workflows at a time: each one's own steps stay in order, and their nodes start as soon as
    // its journal is checked, without one slow workflow holding the rest back or flooding the pool.
    await eachBounded(rows, RECOVERY_CONCURRENCY, async (row, i) => {
      try {
        if (this.#runs.has(row.id)) return;
        outcomes[i] = await this.#recoverOne(row, await journalOf(i), hooks.continueNode ?? null);
      } catch (e) {
        outcomes[i] = "refused";
        // Not driven here after all: the run this attempt registered stops and the lease goes back, so a
        // later pass (here or a peer's) takes the workflow again; kept, no pass would (it looks driven here).
        this.#runs.get(row.id)?.abandon("closing");
        this.#runs.delete(row.id);
        await this.store.handBackWorkflow(row.id, this.options.owner).catch(() => undefined);
        this.options.onEvent?.({
          type: "invalid_journal",
          workflowId: row.id,
          reason: e instanceof Error ? e.message : String(e),
        });
      } finally {
        this.#recovering.delete(row.id);
      }
    });
    rows.forEach((row, i) => {
      const what = outcomes[i];
      if (what) out[what].push(row.id);
    });
    return out;
  }

  /**
   * The claimed workflows' journals, read a chunk of workflows per statement when the first of the chunk
   * is needed (the lease is held: nobody else writes them meanwhile); each body is let go once taken.
   */
  #claimedJournals(rows: readonly WorkflowRow[]): (index: number) => Promise<unknown> {
    const chunks = new Map<number, Promise<Map<string, unknown>>>();
    return async (index) => {
      const chunk = Math.floor(index / JOURNAL_READ_CHUNK);
      let read = chunks.get(chunk);
      if (!read) {
        const ids = rows.slice(chunk * JOURNAL_READ_CHUNK, (chunk + 1) * JOURNAL_READ_CHUNK).map((r) => r.id);
        read = this.store.readJournals(ids);
        chunks.set(chunk, read);
      }
      const bodies = await read;
      const id = (rows[index] as WorkflowRow).id;
      const body = bodies.get(id) ?? null;
      bodies.delete(id);
      return body;
    };
  }

  async #recoverOne(
    row: WorkflowRow,
    body: unknown,
    continueNode: RecoveryContinueNode | null,
  ): Promise<"resumed" | "invalid" | "refused"> {
    const reading = readOrchestrationJournal(body);
    if (!reading.ok) {
      const generation = (await this.store.terminalizeInvalid(row.id)) ?? row.recovery.workflowGeneration;
      await this.store.deliverSummary({
        workflowId: row.id,
        generation,
        resultId: uuidFrom(`${row.id}:invalid`),
        outcome: "error",
        body: `Workflow "${row.name}" (${row.id}) could not be resumed: ${reading.reason}.`,
        keepJournal: true,
      });
      await this.store.releaseWorkflow(row.id, this.options.owner);
      this.options.onEvent?.({ type: "invalid_journal", workflowId: row.id, reason: reading.reason });
      return "invalid";
    }
    const journal = reading.journal;
    // Host-provided native metadata wins over whatever the journal last saw; nothing is reset or charged.
    journal.recovery = { ...row.recovery };
    const run = new WorkflowRun(journal, await this.#deps(journal, continueNode));
    if (row.status !== "running") {
      // Terminal publication settled but the summary was not handed over yet: finish that part only.
      this.#track(run);
      await run.finishDelivery(row.status);
      return "resumed";
    }
    const current = await currentDelegatedAccess(
      this.#repo,
      journal.principalAccountId,
      journal.parentSessionId,
    );
    let refusal: string | undefined = current.ok ? undefined : current.reason;
    if (current.ok) {
      const check = boundaryAgainst(current.authority);
      const scopes = [
        { subject: "parent", scope: originScope(journal.origin.access) },
        ...journal.order.flatMap((id) =>
          journal.nodeAccess[id] ? [{ subject: id, scope: journal.nodeAccess[id] as string }] : [],
        ),
      ];
      for (const s of scopes) {
        const verdict = await check(s);
        if (!verdict.ok) {
          refusal = `${s.subject === "parent" ? "the workflow" : `node ${s.subject}`}: ${verdict.reason}`;
          break;
        }
      }
    }
    this.#track(run);
    if (refusal !== undefined) {
      await run.failWhole(`could not be resumed: journaled access exceeds current access (${refusal})`);
      return "refused";
    }
    if ((await run.publish()).status === "stale") return "refused";
    run.rebuilt = true;
    if (row.cancelRequested) {
      void run.cancel();
      return "resumed";
    }
    for (const id of journal.order) {
      const n = journal.nodes[id] as NodeState;
      if (n.status === "running" && n.childSessionId) run.launch(id, "continue");
      else if (n.status === "running" || n.status === "reserved") {
        // Reserved (and charged) before a crash, but never started: prepared now, not charged again.
        delete n.childSessionId;
        n.status = "reserved";
        run.launch(id, "prepare");
      }
    }
    run.pump();
    return "resumed";
  }
}

/** Workflows a recovery pass prepares at once (each one's statements run one after another). */
const RECOVERY_CONCURRENCY = 8;
/** Claimed workflows whose journals one recovery read fetches. */
const JOURNAL_READ_CHUNK = 16;

/** Runs `fn` over `items` with at most `limit` calls in flight; resolves when all have settled. */
async function eachBounded<T>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      await fn(items[i] as T, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

/** A stable UUID-shaped id derived from `text` (so a repeated boot delivers the same report once). */
export function uuidFrom(text: string): string {
  const h = createHash("sha256").update(text).digest("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`;
}
