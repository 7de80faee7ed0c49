import type { SessionRow } from "@crw/db";
import { z } from "zod";
import { DelegationError } from "./errors.js";
import type { MutatingTool } from "./scopedTools.js";
import type { DelegationService } from "./service.js";
import type { ToolOutput } from "./turn.js";

const delegateArgs = z
  .object({
    task: z.string().min(1).max(100_000),
    background: z.boolean().default(false),
    role: z.string().min(1).max(128).optional(),
    context: z.string().max(16_384).optional(),
    tools: z
      .object({
        allow: z.array(z.string()).max(256).optional(),
        deny: z.array(z.string()).max(256).optional(),
      })
      .strict()
      .optional(),
    readOnly: z.boolean().optional(),
    cwd: z.string().min(1).max(4096).optional(),
    /** worktree: a git worktree and branch of the child's own; crw commits what it leaves. */
    isolation: z.enum(["none", "worktree"]).optional(),
    fork: z.boolean().optional(),
  })
  .strict();

const continueArgs = z
  .object({
    sessionId: z.uuid(),
    text: z.string().min(1).max(100_000),
    background: z.boolean().default(false),
    writeAccess: z.boolean().optional(),
    /** The model this continuation runs on (this call only; the child keeps its own). */
    model: z.string().min(1).max(200).optional(),
    /** Mint the child's scope again from your current access (refused from a read-only turn). */
    promote: z.boolean().optional(),
  })
  .strict();

const readArgs = z.object({ sessionId: z.uuid() }).strict();

// Every turn offers these tools: their JSON schemas are made once, not per turn.
const jsonSchema = (schema: z.ZodType) => z.toJSONSchema(schema, { io: "input" }) as Record<string, unknown>;
const DELEGATE_PARAMETERS = jsonSchema(delegateArgs);
const CONTINUE_PARAMETERS = jsonSchema(continueArgs);
const READ_PARAMETERS = jsonSchema(readArgs);

/** A tool call's arguments checked against `schema`; a typed `invalid_input` naming every issue otherwise. */
export function parseToolArgs<T>(schema: z.ZodType<T>, args: unknown, tool: string): T {
  const parsed = schema.safeParse(args);
  if (!parsed.success) {
    throw new DelegationError(
      "invalid_input",
      `${tool}: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
    );
  }
  return parsed.data;
}

const BACKGROUND_CONTRACT =
  "Keep doing independent work; the result arrives as a message after your current tool round. " +
  "End your turn when no independent work remains. There is no need to wait or poll.";

function receiptOutput(receipt: Awaited<ReturnType<DelegationService["delegate"]>>): ToolOutput {
  switch (receipt.kind) {
    case "result":
      return {
        content: receipt.body,
        isError: receipt.outcome === "error",
        details: {
          resultId: receipt.resultId,
          childSessionId: receipt.childSessionId,
          runId: receipt.runId,
          outcome: receipt.outcome,
        },
      };
    case "started":
      return {
        content: receipt.stalledMs
          ? `The child ${receipt.childSessionId} showed no progress for ${Math.round(receipt.stalledMs / 1000)} s, so it goes on in the background (run ${receipt.runId}). ${BACKGROUND_CONTRACT}`
          : `Started child ${receipt.childSessionId} in the background (run ${receipt.runId}). ${BACKGROUND_CONTRACT}`,
      };
    case "steered":
      return {
        content: `The child ${receipt.childSessionId} is working; your message was queued for it (receipt ${receipt.steerId}).`,
      };
  }
}

/** Delegate, DelegateContinue and DelegateRead as tools of a session's turn. */
export function delegationTools(
  service: DelegationService,
  session: SessionRow,
  readOnly: boolean,
): MutatingTool[] {
  const principal = session.principalAccountId;
  return [
    {
      name: "Delegate",
      description:
        "Give a task to a fresh child session. Foreground waits for its answer; background returns at once.",
      parameters: DELEGATE_PARAMETERS,
      async execute(raw, ctx) {
        const a = parseToolArgs(delegateArgs, raw, "Delegate");
        const receipt = await service.delegate({
          parentSessionId: session.id,
          principalAccountId: principal,
          toolCallId: ctx.toolCallId,
          task: a.task,
          mode: a.background ? "background" : "foreground",
          callerReadOnly: readOnly,
          ...(a.role ? { role: a.role } : {}),
          ...(a.context ? { context: a.context } : {}),
          ...(a.tools ? { tools: a.tools } : {}),
          ...(a.readOnly !== undefined ? { readOnly: a.readOnly } : {}),
          ...(a.cwd ? { workDir: a.cwd } : {}),
          ...(a.isolation ? { isolation: a.isolation } : {}),
          ...(a.fork ? { fork: true } : {}),
          progress: ctx.progress,
        });
        return receiptOutput(receipt);
      },
    },
    {
      name: "DelegateContinue",
      description:
        "Send a follow-up to one of your children; it continues with its own transcript and scope.",
      parameters: CONTINUE_PARAMETERS,
      async execute(raw, ctx) {
        const a = parseToolArgs(continueArgs, raw, "DelegateContinue");
        const receipt = await service.continueSubagent({
          parentSessionId: session.id,
          principalAccountId: principal,
          childSessionId: a.sessionId,
          toolCallId: ctx.toolCallId,
          text: a.text,
          mode: a.background ? "background" : "foreground",
          callerReadOnly: readOnly,
          ...(a.writeAccess !== undefined ? { writeAccess: a.writeAccess } : {}),
          ...(a.model !== undefined ? { model: a.model } : {}),
          ...(a.promote !== undefined ? { promote: a.promote } : {}),
          progress: ctx.progress,
        });
        return receiptOutput(receipt);
      },
    },
    {
      name: "DelegateRead",
      description: "Read the newest answer of one of your children.",
      parameters: READ_PARAMETERS,
      async execute(raw) {
        const a = parseToolArgs(readArgs, raw, "DelegateRead");
        const text = await service.readSubagent(session.id, a.sessionId, principal);
        return text === undefined ? { content: "(the child has no answer yet)" } : { content: text };
      },
    },
  ];
}
