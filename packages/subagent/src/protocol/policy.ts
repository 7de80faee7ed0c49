import { z } from "zod";
import { STARTUP_RETRY_CAP_MS } from "./policyLimits.js";

export { STARTUP_RETRY_CAP_MS };

/**
 * The daemon's retry policy as it crosses IPC. `revision` increases with every committed change; the
 * runner's mirror and the host's update stream compare revisions and never move backwards.
 */
export const retryPolicySchema = z
  .object({
    revision: z.number().int().min(0),
    maxRetries: z.number().int().min(0).max(100),
    initialDelayMs: z.number().int().min(0).max(STARTUP_RETRY_CAP_MS),
    multiplier: z.number().min(1).max(100),
  })
  .strict()
  .readonly();
export type RetryPolicy = z.infer<typeof retryPolicySchema>;

const modelSchema = z
  .object({ id: z.string().min(1).max(256), provider: z.string().min(1).max(128) })
  .strict();
export type CatalogModel = z.infer<typeof modelSchema>;

/** A model catalog publication: the public runtime's models and each prepared account's own view. */
export const modelCatalogSchema = z
  .object({
    revision: z.number().int().min(0),
    public: z.array(modelSchema).max(4096),
    accounts: z.record(z.string().min(1).max(128), z.array(modelSchema).max(4096)),
  })
  .strict();
export type ModelCatalogPublication = z.infer<typeof modelCatalogSchema>;
