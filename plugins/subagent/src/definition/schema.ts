import { parseToolEntry } from "@crw/brain";
import { z } from "zod";
import { outputSchemaShapeProblem } from "./outputSchema.js";

/**
 * Bounds of a workflow definition. Parsing and validation are linear in these; a definition beyond them is
 * refused whole, never truncated.
 */
export const DEFINITION_LIMITS = {
  bytes: 256 * 1024,
  nodes: 500,
  dependencies: 64,
  idLength: 64,
  taskLength: 32 * 1024,
  toolEntries: 64,
  /** Flow nesting of the text (an outputSchema is bounded tighter, see OUTPUT_SCHEMA_LIMITS). */
  nesting: 48,
} as const;

export const NODE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

const nodeId = z
  .string()
  .min(1)
  .max(DEFINITION_LIMITS.idLength)
  .regex(NODE_ID_PATTERN, "a node id is letters, digits, '_', '.', '-', starting with a letter or digit");
const name = z.string().min(1).max(128);
/**
 * An agent type names a key of the type-model pins: a plain name, and never an Object.prototype member
 * (`constructor`, `toString`, `__proto__`), which a record lookup would answer with a function.
 */
const agentTypeName = z
  .string()
  .min(1)
  .max(128)
  .regex(NODE_ID_PATTERN, "an agent type is letters, digits, '_', '.', '-', starting with a letter or digit")
  .refine((n) => !(n in Object.prototype), "an agent type may not be named like an Object.prototype member");
const model = z.string().min(1).max(200);
/** The scope's own tool-entry grammar (`Name` or `Name(argument glob)`), so a bad entry fails here, not at node preparation. */
const toolEntry = z
  .string()
  .min(1)
  .max(640)
  .refine((e) => parseToolEntry(e) !== undefined, "not a tool pattern: Name or Name(argument glob)");
/** A JSON Schema, bounded in depth and size, whose patterns RE2 can run (see outputSchema.ts). */
const outputSchema = z.record(z.string(), z.unknown()).superRefine((schema, ctx) => {
  const problem = outputSchemaShapeProblem(schema);
  if (problem) ctx.addIssue({ code: "custom", message: `the output schema ${problem}` });
});

/** One node: a delegated child with its own task, placement and tool restrictions. */
export const WorkflowNodeSchema = z.strictObject({
  id: nodeId,
  task: z.string().min(1).max(DEFINITION_LIMITS.taskLength),
  /** A free-form role appended to the worker prompt. */
  role: z.string().min(1).max(128).optional(),
  /** A named agent type: its model is pinned once per workflow (see `agentTypes`). */
  agentType: agentTypeName.optional(),
  model: model.optional(),
  dependsOn: z.array(nodeId).max(DEFINITION_LIMITS.dependencies).default([]),
  /** Working directory, resolved against the workflow's cwd and validated through delegatedWorkDir. */
  cwd: z.string().min(1).max(4096).optional(),
  /** worktree: the node works in a git worktree and branch of its own, started from its dependencies'. */
  isolation: z.enum(["none", "worktree"]).optional(),
  tools: z
    .strictObject({
      allow: z.array(toolEntry).max(DEFINITION_LIMITS.toolEntries).optional(),
      deny: z.array(toolEntry).max(DEFINITION_LIMITS.toolEntries).optional(),
    })
    .optional(),
  readOnly: z.boolean().optional(),
  /** JSON Schema the node's final answer (JSON text) must satisfy. */
  outputSchema: outputSchema.optional(),
});
export type WorkflowNodeInput = z.input<typeof WorkflowNodeSchema>;
export type WorkflowNode = z.output<typeof WorkflowNodeSchema>;

export const WorkflowDefinitionSchema = z.strictObject({
  version: z.literal(1).default(1),
  name,
  description: z.string().max(4096).optional(),
  defaults: z.strictObject({ model: model.optional(), agentType: agentTypeName.optional() }).default({}),
  /** Per agent type: the model every node of that type runs on (the type-model pin). */
  agentTypes: z.record(agentTypeName, z.strictObject({ model })).default({}),
  /** How many fresh node dispatches the workflow may make in all (recovery continuations are not charged). */
  maxDispatches: z.number().int().positive().max(10_000).optional(),
  nodes: z.array(WorkflowNodeSchema).min(1).max(DEFINITION_LIMITS.nodes),
});
export type WorkflowDefinitionInput = z.input<typeof WorkflowDefinitionSchema>;
export type WorkflowDefinition = z.output<typeof WorkflowDefinitionSchema>;

/** What WorkflowAddNodes accepts: the same node shape, at most this many per call. */
export const AddedNodesSchema = z.array(WorkflowNodeSchema).min(1).max(100);
