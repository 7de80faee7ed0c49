import { z } from "zod";
import type { HostTurn } from "../host/sessionHost.js";

/** The largest answer the engine reads; a longer final message is an invalid answer, never parsed. */
export const MAX_ANSWER_BYTES = 256 * 1024;

/**
 * The answer of a turn: its last final_answer message; from a provider that sets no phase, its last
 * message without one when no commentary came before it. A commentary message is never the answer.
 */
export function answerText(turn: HostTurn): string | null {
  const messages = turn.items.filter((i) => i.type === "agentMessage");
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (m?.phase === "final_answer") return m.text;
  }
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i];
    if (!m || m.phase !== null) continue;
    const commentaryBefore = messages.slice(0, i).some((x) => x.phase === "commentary");
    return commentaryBefore ? null : m.text;
  }
  return null;
}

export type ParsedAnswer =
  | { ok: true; value: Record<string, unknown>; extracted: boolean }
  | { ok: false; error: string };

/**
 * The JSON object of an answer. A message that is one object is taken whole; when prose precedes it, the
 * object that ends the message is taken out of it (extracted). No object, several objects, an answer
 * that is too large or an array are errors that a repair turn names.
 */
export function parseAnswer(text: string): ParsedAnswer {
  if (Buffer.byteLength(text) > MAX_ANSWER_BYTES) {
    return { ok: false, error: `the answer is larger than ${MAX_ANSWER_BYTES} bytes` };
  }
  const trimmed = text.trim();
  const whole = tryObject(trimmed);
  if (whole) return { ok: true, value: whole, extracted: false };
  if (!trimmed.endsWith("}")) return { ok: false, error: "the answer does not end with a JSON object" };
  const start = objectEndingAt(trimmed);
  if (start === null) return { ok: false, error: "the answer holds no valid JSON object" };
  const value = tryObject(trimmed.slice(start)) as Record<string, unknown>;
  const before = trimmed.slice(0, start).trimEnd();
  if (before.endsWith("}") && objectEndingAt(before) !== null) {
    return { ok: false, error: "the answer holds several JSON objects; it must be exactly one" };
  }
  return { ok: true, value, extracted: true };
}

function objectEndingAt(text: string): number | null {
  let tries = 0;
  for (let i = text.indexOf("{"); i >= 0 && tries < 4096; i = text.indexOf("{", i + 1), tries++) {
    if (tryObject(text.slice(i))) return i;
  }
  return null;
}

function tryObject(text: string): Record<string, unknown> | null {
  if (!text.startsWith("{")) return null;
  try {
    const v = JSON.parse(text) as unknown;
    return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

// A workflow's calls share a few schemas: each is turned into a validator once per process.
const validators = new Map<string, z.ZodType>();
const MAX_VALIDATORS = 256;

function validatorOf(schema: Record<string, unknown>): z.ZodType {
  const key = JSON.stringify(schema);
  let v = validators.get(key);
  if (!v) {
    v = z.fromJSONSchema(schema as Parameters<typeof z.fromJSONSchema>[0]);
    if (validators.size >= MAX_VALIDATORS) validators.clear();
    validators.set(key, v);
  }
  return v;
}

/** Checks a value against a call's JSON Schema; answers the errors (empty when valid). */
export function validateAgainst(schema: Record<string, unknown> | null, value: unknown): string[] {
  if (!schema) return [];
  const r = validatorOf(schema).safeParse(value);
  if (r.success) return [];
  return r.error.issues
    .slice(0, 20)
    .map((i) => `${i.path.length ? i.path.join(".") : "(root)"}: ${i.message}`);
}

export type AnswerVerdict =
  | { ok: true; value: Record<string, unknown>; extracted: boolean; text: string }
  | { ok: false; errors: string[] };

/**
 * A turn's answer judged for its call: parsed and valid against the schema, or the errors a repair turn
 * names (a turn with no answer message is one of them).
 */
export function judgeAnswer(text: string | null, schema: Record<string, unknown> | null): AnswerVerdict {
  if (text === null) return { ok: false, errors: ["the turn ended with no final answer message"] };
  const parsed = parseAnswer(text);
  if (!parsed.ok) return { ok: false, errors: [parsed.error] };
  const errors = validateAgainst(schema, parsed.value);
  return errors.length === 0 ? { ...parsed, text } : { ok: false, errors };
}

/** Throws when a workflow's schema is not one the validator can use. */
export function checkSchema(schema: Record<string, unknown>): void {
  validatorOf(schema);
}
