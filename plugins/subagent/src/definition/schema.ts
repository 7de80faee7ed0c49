import { z } from "zod";

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
} as const;

export const NODE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

const nodeId = z
  .string()
  .min(1)
  .max(DEFINITION_LIMITS.idLength)
  .regex(NODE_ID_PATTERN, "a node id is letters, digits, '_', '.', '-', starting with a letter or digit");
const name = z.string().min(1).max(128);
const model = z.string().min(1).max(200);
const toolEntry = z.string().min(1).max(640);

/** One node: a delegated child with its own task, placement and tool restrictions. */
export const WorkflowNodeSchema = z.strictObject({
  id: nodeId,
  task: z.string().min(1).max(DEFINITION_LIMITS.taskLength),
  /** A free-form role appended to the worker prompt. */
  role: z.string().min(1).max(128).optional(),
  /** A named agent type: its model is pinned once per workflow (see `agentTypes`). */
  agentType: name.optional(),
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
  outputSchema: z.record(z.string(), z.unknown()).optional(),
});
export type WorkflowNodeInput = z.input<typeof WorkflowNodeSchema>;
export type WorkflowNode = z.output<typeof WorkflowNodeSchema>;

export const WorkflowDefinitionSchema = z.strictObject({
  version: z.literal(1).default(1),
  name,
  description: z.string().max(4096).optional(),
  defaults: z.strictObject({ model: model.optional(), agentType: name.optional() }).default({}),
  /** Per agent type: the model every node of that type runs on (the type-model pin). */
  agentTypes: z.record(name, z.strictObject({ model })).default({}),
  /** How many fresh node dispatches the workflow may make in all (recovery continuations are not charged). */
  maxDispatches: z.number().int().positive().max(10_000).optional(),
  nodes: z.array(WorkflowNodeSchema).min(1).max(DEFINITION_LIMITS.nodes),
});
export type WorkflowDefinitionInput = z.input<typeof WorkflowDefinitionSchema>;
export type WorkflowDefinition = z.output<typeof WorkflowDefinitionSchema>;

/** What WorkflowAddNodes accepts: the same node shape, at most this many per call. */
export const AddedNodesSchema = z.array(WorkflowNodeSchema).min(1).max(100);
