import { z } from "zod";

/**
 * The reverse host calls a runner may make to the daemon, each with its own params schema. The daemon
 * validates params here (the plugin-boundary schema for plugin.applyChange) before any handler sees them.
 */
export const HOST_RPC_METHODS = [
  "workflow.addNodes",
  "crw.api",
  "desktop.command",
  "plugin.applyChange",
  "delegation.resultDelivered",
] as const;
export type HostRpcMethod = (typeof HOST_RPC_METHODS)[number];
export const hostRpcMethodSchema = z.enum(HOST_RPC_METHODS);

const id = z.string().min(1).max(128);

export const hostRpcParamsSchemas = {
  "workflow.addNodes": z
    .object({
      workflowId: id,
      nodes: z
        .array(
          z
            .object({ id, prompt: z.string().max(1_000_000), dependsOn: z.array(id).max(256).optional() })
            .strict(),
        )
        .min(1)
        .max(256),
    })
    .strict(),
  "crw.api": z
    .object({
      method: z.enum(["GET", "POST"]),
      path: z.string().min(1).max(2048).startsWith("/"),
      body: z.unknown().optional(),
    })
    .strict(),
  "desktop.command": z
    .object({ command: z.string().min(1).max(256), args: z.array(z.string()).max(256) })
    .strict(),
  "plugin.applyChange": z
    .object({
      pluginId: id,
      change: z.discriminatedUnion("kind", [
        z.object({ kind: z.literal("skill"), name: id, body: z.string().max(1_000_000) }).strict(),
        z
          .object({
            kind: z.literal("mcpServer"),
            name: id,
            command: z.array(z.string().min(1)).min(1).max(256),
          })
          .strict(),
      ]),
    })
    .strict(),
  "delegation.resultDelivered": z
    .object({
      parentSessionId: id,
      results: z
        .array(z.object({ resultId: id, toolCallId: id, kind: z.enum(["result", "workflow"]) }).strict())
        .min(1)
        .max(1024),
    })
    .strict(),
} satisfies Record<HostRpcMethod, z.ZodType>;

export type HostRpcParams<M extends HostRpcMethod> = z.infer<(typeof hostRpcParamsSchemas)[M]>;
