import {
  array,
  frozen,
  type Issue,
  integer,
  isObject,
  literal,
  number,
  oneOfKey,
  optional,
  record,
  strictObject,
  summarizeIssues,
  text,
  textKey,
  unknownValue,
  url,
} from "./check.js";
import type { FrameParse } from "./index.js";
import type { BootFrame } from "./input.js";
import { STARTUP_RETRY_CAP_MS } from "./policyLimits.js";

/**
 * The boot frame, checked without the schema library: it is the one frame a runner must read before it is
 * ready, and its boot path loads nothing heavier than this. Each entry mirrors bootFrameSchema (input.ts)
 * and the schemas it uses (retryPolicySchema, modelCatalogSchema, agentOptionsSchema); the schemas stay the
 * daemon's source of truth and the type, and test/bootFrame.test.ts holds both to the same verdicts.
 */
const id = text(1, 128);
const model = strictObject({ id: text(1, 256), provider: text(1, 128) });
const agentApis = ["openai-responses", "openai-completions", "anthropic-messages"] as const;

const retryPolicy = frozen(
  strictObject({
    revision: integer(0),
    maxRetries: integer(0, 100),
    initialDelayMs: integer(0, STARTUP_RETRY_CAP_MS),
    multiplier: number(1, 100, false),
  }),
);

const catalog = strictObject({
  revision: integer(0),
  public: array(model, 4096),
  accounts: record(textKey(1, 128), "1 to 128 characters", array(model, 4096)),
});

const agentOptions = strictObject({
  baseUrls: optional(record(oneOfKey(agentApis), agentApis.join(" | "), url(2048))),
  apiKeyEnv: optional(record(oneOfKey(agentApis), agentApis.join(" | "), text(1, 256))),
  scripts: optional(
    record(
      textKey(1, 200),
      "1 to 200 characters",
      array(
        record(() => true, "a string", unknownValue),
        10_000,
      ),
    ),
  ),
});

const bootFrame = frozen(
  strictObject({
    type: literal("boot"),
    requestId: id,
    runnerId: id,
    buildId: text(1, 256),
    retryPolicy,
    catalog,
    heartbeatIntervalMs: integer(10, 600_000),
    agent: optional(agentOptions),
  }),
);

/** Whether a received frame says it is a boot frame (the schema's discriminated union picks the same way). */
export function isBootFrameCandidate(raw: unknown): boolean {
  return isObject(raw) && raw.type === "boot";
}

/** Validate a boot frame received by the runner; a refused one is logged by the caller, never acted on. */
export function parseBootFrame(raw: unknown): FrameParse<BootFrame> {
  const issues: Issue[] = [];
  const frame = bootFrame(raw, [], issues);
  return issues.length === 0
    ? { ok: true, frame: frame as BootFrame }
    : { ok: false, issues: summarizeIssues(issues) };
}
