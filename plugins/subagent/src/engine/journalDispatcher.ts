import {
  type AssistantMessage,
  createNodeSession,
  createPlannedNodeSession,
  type DelegationRepository,
  type JournalEntry,
  type NodeSessionRelation,
  nodeSessionRelations,
  type TranscriptMessage,
} from "@crw/db";
import { WorkflowStateError } from "../errors.js";
import { TickBatchedReader } from "../store/batch.js";
import type {
  NodeChildRequest,
  NodeContinueRequest,
  NodeDispatcher,
  NodeEvent,
  NodeOutputReference,
  NodeRecoveryHost,
  NodeRunRequest,
  NodeRunResult,
} from "./dispatch.js";

/** A uuid as PostgreSQL prints it (lower-case, hyphenated): the only text a session id column compares equal to. */
const CANONICAL_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function outputsOf(outputs: NodeOutputReference[]): { outputs?: NodeOutputReference[] } {
  return outputs.length > 0 ? { outputs } : {};
}

/**
 * One turn of a node's child: the same contract as the delegation core's ChildTurnRunner (each assistant
 * message is recorded, and awaited, before anything it asks for runs; failures and aborts come back as the
 * outcome, not as a throw). A node turn carries no tools of its own here: its tool catalog is the runner's.
 */
export interface NodeTurnRunner {
  runTurn(
    request: {
      readonly sessionId: string;
      readonly principalAccountId: string;
      readonly model: string;
      readonly systemPrompt: string;
      readonly context: readonly TranscriptMessage[];
      readonly signal: AbortSignal;
    },
    host: {
      record(message: AssistantMessage): Promise<void>;
      progress(event: NodeEvent): void;
    },
  ): Promise<{ stopReason: "stop" | "error" | "aborted"; errorMessage?: string }>;
}

/**
 * One turn of a node's child over its journal, which already ends with the turn's input. `known`, when
 * given, is that settled journal exactly as the caller has just read and appended it: an executor may take
 * it as the turn's context instead of reading the journal again. An executor that knows the whole settled
 * journal through the turn's last row returns it as `journal` (the dispatcher reads it otherwise).
 */
export interface NodeTurnExecutor {
  executeTurn(
    child: { sessionId: string; principalAccountId: string; model: string; scope: string },
    signal: AbortSignal,
    onEvent?: (event: NodeEvent) => void,
    known?: readonly JournalEntry[],
  ): Promise<{
    stopReason: "stop" | "error" | "aborted";
    errorMessage?: string;
    reply?: string;
    journal?: readonly JournalEntry[];
  }>;
}

/** What the dispatcher's child prompts start with: a worker's contract, not a conversational persona. */
export const NODE_SYSTEM_PROMPT = [
  "You are a worker running one node of a workflow.",
  "Do the task in the last user message within your scope, verify what you changed, and end with a short",
  "report: what you did, the evidence, and anything the next node must know. If you are blocked, say so.",
].join(" ");

/**
 * `known` followed by `appended`, when that is provably the whole settled journal: the appended rows took
 * the very next sequence numbers (no row of another writer, provisional or not, sits between), and the
 * first appended row of an empty known journal is the session's first. Undefined otherwise (read it).
 */
export function extendedJournal(
  known: readonly JournalEntry[],
  appended: readonly JournalEntry[],
): JournalEntry[] | undefined {
  let last = known.at(-1)?.seq ?? 0;
  for (const e of appended) {
    if (e.seq !== last + 1 || !e.settled) return undefined;
    last = e.seq;
  }
  return [...known, ...appended];
}

function messagesOf(entries: readonly JournalEntry[]): TranscriptMessage[] {
  const out: TranscriptMessage[] = [];
  for (const e of entries) if (e.body.type === "message") out.push(e.body.message);
  return out;
}

/**
 * Output capture over the child's whole context: every tool result and delivered delegation result that
 * names a stored output (result id, spill path), in transcript order, from every turn — never only the
 * final assistant text.
 */
export function outputReferences(entries: readonly JournalEntry[]): NodeOutputReference[] {
  const out: NodeOutputReference[] = [];
  for (const e of entries) {
    if (e.body.type !== "message") continue;
    const m = e.body.message;
    if (m.role === "toolResult" && m.details && (m.details.resultId || m.details.spillPath)) {
      out.push({
        toolName: m.toolName,
        toolCallId: m.toolCallId,
        resultId: m.details.resultId,
        ...(m.details.childSessionId ? { childSessionId: m.details.childSessionId } : {}),
        ...(m.details.spillPath ? { spillPath: m.details.spillPath } : {}),
        ...(m.details.byteSize !== undefined ? { byteSize: m.details.byteSize } : {}),
        isError: m.isError,
      });
    } else if (m.role === "custom" && m.customType === "delegation_result" && m.details) {
      out.push({
        toolName: "delegation_result",
        resultId: m.details.resultId,
        ...(m.details.childSessionId ? { childSessionId: m.details.childSessionId } : {}),
        ...(m.details.spillPath ? { spillPath: m.details.spillPath } : {}),
        ...(m.details.byteSize !== undefined ? { byteSize: m.details.byteSize } : {}),
      });
    }
  }
  return out;
}

function textOf(message: AssistantMessage): string {
  return message.content
    .filter((c): c is { type: "text"; text: string } => c.type === "text")
    .map((c) => c.text)
    .join("");
}

/**
 * A NodeDispatcher over the delegation core's durable journal: the node's child is a delegated session of
 * the workflow's parent (with its captured scope and no subagent run row), its prompt and every assistant
 * message are journaled, and recovery reads that journal instead of guessing. The turn itself runs through
 * the `NodeTurnRunner` (the agent loop, a runner of the pool, or the scripted runner).
 */
export class JournalNodeDispatcher implements NodeDispatcher {
  readonly #turns: NodeTurnExecutor;
  /** Child sessions' relations, read per tick: the nodes a recovery pass continues share a statement. */
  readonly #sessions = new TickBatchedReader<string, NodeSessionRelation>((ids) =>
    nodeSessionRelations(this.repo.pool, ids),
  );

  constructor(
    private readonly repo: DelegationRepository & { readonly pool: import("pg").Pool },
    turns: NodeTurnRunner | NodeTurnExecutor,
  ) {
    this.#turns = "executeTurn" in turns ? turns : journalTurnExecutor(repo, turns);
  }

  async createChild(request: NodeChildRequest): Promise<string> {
    const child = {
      parentSessionId: request.parentSessionId,
      principalAccountId: request.principalAccountId,
      model: request.model,
      scope: request.scope,
    };
    if (request.childSessionId === undefined) return createNodeSession(this.repo.pool, child);
    // Created with its planned id, or adopted: a row left by a process killed right after inserting it
    // is the same planned child (same parent and principal, nothing journaled yet); it takes the
    // model and scope prepared now. Anything else with that id is refused, never reused.
    const id = await createPlannedNodeSession(this.repo.pool, request.childSessionId, child);
    if (id === null)
      throw new WorkflowStateError(
        "child_mismatch",
        `node ${request.nodeId}: session ${request.childSessionId} exists and is not its planned child`,
        { workflowId: request.workflowId, nodeId: request.nodeId },
      );
    return id;
  }

  async runNode(request: NodeRunRequest): Promise<NodeRunResult> {
    const task = await this.repo.append(request.childSessionId, request.principalAccountId, [
      { body: { type: "message", message: { role: "user", content: request.prompt } } },
    ]);
    // A planned child is empty until its task: when the task took seq 1, it is the whole journal.
    return this.#turn(request, "answered", extendedJournal([], task));
  }

  async continueNode(request: NodeContinueRequest, host: NodeRecoveryHost = {}): Promise<NodeRunResult> {
    if (typeof request !== "object" || request === null) {
      // One canonical input object: there is no positional (child, text) form.
      throw new TypeError("continueNode takes one WorkflowNodeContinueInput object");
    }
    await this.#assertParentRelation(request);
    const entries = await this.repo.readJournal(request.childSessionId, request.principalAccountId);
    const messages = messagesOf(entries);
    if (request.fallbackPrompt !== undefined) {
      // An explicit retry in the same child: the new task joins the transcript; the old attempt is not reused.
      const retry = await this.repo.append(request.childSessionId, request.principalAccountId, [
        { body: { type: "message", message: { role: "user", content: request.fallbackPrompt } } },
      ]);
      return this.#turn(request, "continued", extendedJournal(entries, retry));
    }
    const last = messages.at(-1);
    if (last === undefined) {
      // A planned child that never got its task: only the daemon-local recovery path may start it fresh.
      const task = host.startFresh ? await host.startFresh() : (request.task ?? "");
      if (task.length === 0) return { status: "empty" };
      const fresh = await this.repo.append(request.childSessionId, request.principalAccountId, [
        { body: { type: "message", message: { role: "user", content: task } } },
      ]);
      return this.#turn(request, "continued", extendedJournal(entries, fresh));
    }
    // A settled answer after the last task is the node's answer: reuse it, run nothing.
    if (last.role === "assistant" && last.stopReason === "stop" && textOf(last).length > 0) {
      return { status: "answered", reply: textOf(last), ...outputsOf(outputReferences(entries)) };
    }
    const note = await this.repo.append(request.childSessionId, request.principalAccountId, [
      {
        body: {
          type: "message",
          message: {
            role: "custom",
            customType: "interrupted",
            content:
              "Your previous turn was interrupted by a restart. Verify the last step before repeating anything, then finish the task.",
          },
        },
      },
    ]);
    return this.#turn(request, "continued", extendedJournal(entries, note));
  }

  /**
   * The child must durably be a delegated session of the workflow's parent under the same principal. An
   * absent child identity is not a wildcard: it refuses like a mismatch.
   */
  async #assertParentRelation(request: NodeContinueRequest): Promise<void> {
    const refuse = (why: string) =>
      new WorkflowStateError("child_mismatch", `node ${request.nodeId} cannot be continued: ${why}`, {
        workflowId: request.workflowId,
        nodeId: request.nodeId,
        childSessionId: request.childSessionId ?? null,
      });
    if (typeof request.childSessionId !== "string" || request.childSessionId.length === 0) {
      throw refuse("the request names no child session");
    }
    // Only a session id in its canonical text form can name a row; matching it as a uuid keeps the key lookup.
    const row = CANONICAL_UUID.test(request.childSessionId)
      ? await this.#sessions.read(request.childSessionId)
      : undefined;
    if (!row) throw refuse(`child session ${request.childSessionId} does not exist`);
    if (row.kind !== "delegated" || row.principal !== request.principalAccountId) {
      throw refuse(`session ${request.childSessionId} is not a delegated session of this principal`);
    }
    if (request.parentSessionId !== undefined && row.parent !== request.parentSessionId) {
      throw refuse(`session ${request.childSessionId} is not a child of the workflow's parent`);
    }
  }

  async #turn(
    request: NodeRunRequest | NodeContinueRequest,
    as: "answered" | "continued",
    known?: readonly JournalEntry[],
  ): Promise<NodeRunResult> {
    if (request.signal.aborted) return { status: "aborted" };
    const outcome = await this.#turns.executeTurn(
      {
        sessionId: request.childSessionId,
        principalAccountId: request.principalAccountId,
        model: request.model,
        scope: request.scope,
      },
      request.signal,
      request.onEvent,
      known,
    );
    if (outcome.stopReason === "aborted" || request.signal.aborted) return { status: "aborted" };
    if (outcome.stopReason === "error") {
      return {
        status: "failed",
        error: { code: "node_turn_failed", message: outcome.errorMessage ?? "the node's turn failed" },
      };
    }
    const reply = outcome.reply ?? "";
    if (reply.length === 0) {
      return {
        status: "failed",
        error: { code: "empty_answer", message: "the node ended without an answer" },
      };
    }
    // Output capture needs the whole context; it is read only when the executor does not know it exactly.
    const journal =
      outcome.journal ?? (await this.repo.readJournal(request.childSessionId, request.principalAccountId));
    return { status: as, reply, ...outputsOf(outputReferences(journal)) };
  }
}

/** Runs a low-level `NodeTurnRunner` over the child's journal, journaling each assistant message it records. */
export function journalTurnExecutor(repo: DelegationRepository, runner: NodeTurnRunner): NodeTurnExecutor {
  return {
    async executeTurn(child, signal, onEvent, known) {
      const read = known ?? (await repo.readJournal(child.sessionId, child.principalAccountId));
      const context = messagesOf(read);
      // The journal as this turn knows it: undefined once another writer's row may sit in between.
      let journal: JournalEntry[] | undefined = [...read];
      let reply: string | undefined;
      const outcome = await runner.runTurn(
        {
          sessionId: child.sessionId,
          principalAccountId: child.principalAccountId,
          model: child.model,
          systemPrompt: NODE_SYSTEM_PROMPT,
          context,
          signal,
        },
        {
          record: async (message) => {
            const rows = await repo.append(child.sessionId, child.principalAccountId, [
              { body: { type: "message", message } },
            ]);
            journal = journal && extendedJournal(journal, rows);
            if (message.stopReason === "stop") reply = textOf(message);
          },
          progress: (event) => onEvent?.(event),
        },
      );
      return { ...outcome, ...(reply !== undefined ? { reply } : {}), ...(journal ? { journal } : {}) };
    },
  };
}

/**
 * A deterministic NodeTurnRunner for offline runs, tests and benchmarks: `answer` decides each turn from the
 * child's context (the last user message is its task). It records one assistant message, as a provider would.
 */
export function scriptedNodeTurnRunner(
  answer: (input: {
    sessionId: string;
    task: string;
    context: readonly TranscriptMessage[];
    signal: AbortSignal;
  }) => Promise<string> | string,
  model = "scripted",
): NodeTurnRunner {
  return {
    async runTurn(request, host) {
      const task = [...request.context].reverse().find((m) => m.role === "user");
      let text: string;
      try {
        text = await answer({
          sessionId: request.sessionId,
          task: task?.role === "user" ? task.content : "",
          context: request.context,
          signal: request.signal,
        });
      } catch (e) {
        if (request.signal.aborted) return { stopReason: "aborted" };
        return { stopReason: "error", errorMessage: e instanceof Error ? e.message : String(e) };
      }
      if (request.signal.aborted) return { stopReason: "aborted" };
      host.progress({ type: "text", text });
      await host.record({ role: "assistant", content: [{ type: "text", text }], stopReason: "stop", model });
      return { stopReason: "stop" };
    },
  };
}
