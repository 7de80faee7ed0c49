import { DelegationDbError } from "../errors.js";
import type {
  Account,
  QueuedResult,
  SessionRow,
  SteerReceipt,
  SubagentRun,
} from "../repositories/delegation.js";
import { type JournalBody, type JournalEntry, journalBodySchema } from "../repositories/journal.js";

// Row mapping, one place: the database speaks snake_case text, the contracts camelCase types.

export type Row = Record<string, unknown>;

const str = (v: unknown): string => String(v);
const strOrNull = (v: unknown): string | null => (v === null || v === undefined ? null : String(v));
const num = (v: unknown): number => Number(v);
const date = (v: unknown): Date => (v instanceof Date ? v : new Date(String(v)));
const dateOrNull = (v: unknown): Date | null => (v === null || v === undefined ? null : date(v));

export function accountFromRow(r: Row): Account {
  return {
    id: str(r.id),
    name: str(r.name),
    toolAllow: (r.tool_allow as string[] | null) ?? null,
    toolDeny: (r.tool_deny as string[]) ?? [],
    permissionSettings: (r.permission_settings as Record<string, unknown>) ?? {},
    isOwner: Boolean(r.is_owner),
    isAdministrator: Boolean(r.is_administrator),
  };
}

export function sessionFromRow(r: Row): SessionRow {
  return {
    id: str(r.id),
    kind: r.kind === "root" ? "root" : "delegated",
    parentSessionId: strOrNull(r.parent_session_id),
    principalAccountId: str(r.principal_account_id),
    model: str(r.model),
    scope: strOrNull(r.scope),
    systemPrompt: strOrNull(r.system_prompt),
    createdAt: date(r.created_at),
    ...(r.inherited_through === undefined
      ? {}
      : { inheritedThrough: r.inherited_through === null ? null : num(r.inherited_through) }),
    ...(r.driver === "client" ? { driver: "client" as const } : {}),
    ...(typeof r.name === "string" ? { name: r.name } : {}),
  };
}

export function runFromRow(r: Row): SubagentRun {
  return {
    id: str(r.id),
    parentSessionId: str(r.parent_session_id),
    principalAccountId: str(r.principal_account_id),
    toolCallId: str(r.tool_call_id),
    childSessionId: strOrNull(r.child_session_id),
    kind: r.kind === "continue" ? "continue" : "delegate",
    mode: r.mode === "background" ? "background" : "foreground",
    task: str(r.task),
    status: str(r.status) as SubagentRun["status"],
    generation: num(r.generation),
    readOnlyScope: strOrNull(r.read_only_scope),
    model: strOrNull(r.model),
    progress: strOrNull(r.progress),
    progressSeq: r.progress_seq === undefined ? 0 : num(r.progress_seq),
    recoveryAttempts: num(r.recovery_attempts),
    freeContinuations: r.free_continuations === undefined ? 0 : num(r.free_continuations),
    error: (r.error as SubagentRun["error"]) ?? null,
    createdAt: date(r.created_at),
    startedAt: dateOrNull(r.started_at),
    settledAt: dateOrNull(r.settled_at),
  };
}

export function resultFromRow(r: Row): QueuedResult {
  return {
    id: str(r.id),
    queueSeq: num(r.queue_seq),
    parentSessionId: str(r.parent_session_id),
    childSessionId: strOrNull(r.child_session_id),
    runId: strOrNull(r.run_id),
    toolCallId: str(r.tool_call_id),
    kind: r.kind === "workflow_summary" ? "workflow_summary" : "subagent",
    outcome: r.outcome === "error" ? "error" : "ok",
    mode: r.mode === "foreground" ? "foreground" : "background",
    body: str(r.body),
    byteSize: num(r.byte_size),
    spillPath: strOrNull(r.spill_path),
  };
}

export function steerFromRow(r: Row): SteerReceipt {
  return {
    id: str(r.id),
    childSessionId: str(r.child_session_id),
    text: str(r.text),
    status: str(r.status) as SteerReceipt["status"],
    journalSeq: r.journal_seq === null || r.journal_seq === undefined ? null : num(r.journal_seq),
    dropReason: strOrNull(r.drop_reason),
  };
}

/** Decodes the original JSON text of a journal row; a row that does not parse is an error, never skipped. */
export function decodeBody(sessionId: string, seq: number, text: string): JournalBody {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new DelegationDbError(
      "malformed_entry",
      "journal row is not JSON",
      { sessionId, seq },
      { cause: e },
    );
  }
  const parsed = journalBodySchema.safeParse(json);
  if (!parsed.success) {
    throw new DelegationDbError(
      "malformed_entry",
      `journal row does not match its schema: ${parsed.error.message}`,
      {
        sessionId,
        seq,
      },
    );
  }
  return parsed.data;
}

export function entryFromRow(r: Row): JournalEntry {
  return entryDecodedBy(r, decodeBody);
}

/** A journal row as an entry, its body read by `decode`. */
export function entryDecodedBy(
  r: Row,
  decode: (sessionId: string, seq: number, text: string) => JournalBody,
): JournalEntry {
  const sessionId = str(r.session_id);
  const seq = num(r.seq);
  return {
    sessionId,
    seq,
    body: decode(sessionId, seq, str(r.body)),
    settled: Boolean(r.settled),
    createdAt: date(r.created_at),
  };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Ids arrive from tools and clients: a malformed one is bad input, not a database error. */
export function assertUuid(what: string, value: string): void {
  if (!UUID.test(value))
    throw new DelegationDbError("invalid_input", `${what} is not a uuid`, { [what]: value });
}

export function notFound(what: string, context: Record<string, unknown>): DelegationDbError {
  return new DelegationDbError("not_found", `${what} not found`, context);
}
