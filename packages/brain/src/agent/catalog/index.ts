import { createHash } from "node:crypto";
import { z } from "zod";
import type {
  SessionTurnRunner,
  ToolContext,
  ToolOutput,
  TurnHost,
  TurnOutcome,
  TurnRequest,
  TurnTool,
} from "../../delegation/turn.js";
import { CHILD_TOOL_NAMES, permittedToolNames } from "../tools.js";

/**
 * The shared whole-catalog deferral policy. A turn's complete unresolved catalog is every tool it could
 * declare to the provider: the child tools its scope permits (read, write, edit, shell) and every host tool
 * (Delegate and friends, the workflow tools, MCP servers' bridged tools). While that catalog has at most
 * `maxDirectTools` entries every tool is declared directly. Past it, only the locked core set stays
 * declared; every other tool is deferred: not declared, but listed by name in the deferred catalog's
 * `ToolSearch` (which returns descriptions and argument schemas) and called through `ToolCall`.
 *
 * The model-only tools (`ToolSearch` and `ToolCall`: they act on nothing but the catalog itself) are always
 * declared directly when deferral is on and never count towards the threshold. The plan depends only on
 * the names in the catalog, so the same request gives the same declared prefix in a runner and in the
 * daemon, on every turn, for a parent and for its fork.
 */
export const TOOL_SEARCH = "ToolSearch";
export const TOOL_CALL = "ToolCall";

export interface CatalogPolicy {
  /** Bumped with any change of the deferred catalog's own tools (names, descriptions, schemas). */
  readonly version: number;
  /** The largest complete catalog declared whole; one more tool and non-core tools are deferred. */
  readonly maxDirectTools: number;
  /** Tools that are always declared directly (they must include every child tool). */
  readonly core: readonly string[];
  /** Model-only tools, declared directly whenever deferral is on; never deferred, never counted. */
  readonly modelOnly: readonly string[];
}

export const DEFAULT_CATALOG_POLICY: CatalogPolicy = Object.freeze({
  version: 1,
  // A session's native host tools (Delegate, DelegateContinue, DelegateRead and the four workflow tools)
  // plus one: any catalog that adds two tools to them (an MCP server, or the child tools) is deferred.
  maxDirectTools: 8,
  core: Object.freeze([
    ...CHILD_TOOL_NAMES,
    "Delegate",
    "DelegateContinue",
    "DelegateRead",
    "WorkflowStart",
    "WorkflowAddNodes",
    "WorkflowRead",
  ]),
  modelOnly: Object.freeze([TOOL_SEARCH, TOOL_CALL]),
});

/** The configuration piece a host reads (e.g. the daemon's `tools` section). */
export const catalogConfigSchema = z
  .object({
    maxDirectTools: z.number().int().min(0).max(1000).optional(),
    /** Extra names for the locked core set (the defaults always stay in it). */
    core: z.array(z.string().min(1).max(128)).max(256).optional(),
  })
  .strict();
export type CatalogConfig = z.infer<typeof catalogConfigSchema>;

export type CatalogErrorCode = "invalid_policy" | "unknown_deferred_tool" | "invalid_input";

export class CatalogError extends Error {
  override readonly name = "CatalogError";
  constructor(
    readonly code: CatalogErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
  }
}

/** The policy a host's configuration asks for, checked whole (a child tool outside core is refused). */
export function catalogPolicyFrom(config: CatalogConfig = {}): CatalogPolicy {
  const parsed = catalogConfigSchema.safeParse(config);
  if (!parsed.success)
    throw new CatalogError(
      "invalid_policy",
      `tool catalog configuration is invalid: ${parsed.error.message}`,
    );
  return checkPolicy({
    ...DEFAULT_CATALOG_POLICY,
    ...(parsed.data.maxDirectTools !== undefined ? { maxDirectTools: parsed.data.maxDirectTools } : {}),
    core: [...new Set([...DEFAULT_CATALOG_POLICY.core, ...(parsed.data.core ?? [])])],
  });
}

function checkPolicy(policy: CatalogPolicy): CatalogPolicy {
  // Child tools are added by the agent loop itself, below this layer: they cannot be deferred.
  const missing = CHILD_TOOL_NAMES.filter((n) => !policy.core.includes(n));
  if (missing.length > 0)
    throw new CatalogError(
      "invalid_policy",
      `the core set must keep the child tools (${missing.join(", ")})`,
    );
  const clash = policy.modelOnly.filter((n) => policy.core.includes(n));
  if (clash.length > 0)
    throw new CatalogError("invalid_policy", `model-only tools cannot be core tools (${clash.join(", ")})`);
  if (!Number.isInteger(policy.maxDirectTools) || policy.maxDirectTools < 0)
    throw new CatalogError("invalid_policy", "maxDirectTools must be a non-negative integer");
  return policy;
}

export interface CatalogPlan {
  /** Whether the complete catalog exceeded the threshold. */
  readonly deferring: boolean;
  /** Every tool name of the complete unresolved catalog, in catalog order, each once. */
  readonly complete: readonly string[];
  /** Names declared directly (catalog order), the model-only tools last when deferring. */
  readonly declared: readonly string[];
  /** Names reachable only through the deferred catalog (catalog order). */
  readonly deferred: readonly string[];
}

/** The one decision: which names are declared and which are deferred, from the names alone. */
export function planCatalog(
  names: readonly string[],
  policy: CatalogPolicy = DEFAULT_CATALOG_POLICY,
): CatalogPlan {
  const complete = [...new Set(names.filter((n) => !policy.modelOnly.includes(n)))];
  if (complete.length <= policy.maxDirectTools)
    return { deferring: false, complete, declared: complete, deferred: [] };
  const core = new Set(policy.core);
  const deferred = complete.filter((n) => !core.has(n));
  if (deferred.length === 0) return { deferring: false, complete, declared: complete, deferred: [] };
  return {
    deferring: true,
    complete,
    declared: [...complete.filter((n) => core.has(n)), ...policy.modelOnly],
    deferred,
  };
}

/**
 * The complete unresolved catalog of one turn request: the child tools the agent loop will add (a turn
 * with a working directory on this host), then the request's host tools (a host tool wins a name clash).
 */
export function catalogNames(
  request: Pick<TurnRequest, "tools" | "scope" | "workDir" | "readOnly">,
): string[] {
  const host = request.tools.map((t) => t.name);
  const hostNames = new Set(host);
  const childTools = request.workDir !== null && (request.scope?.target.kind ?? "host") === "host";
  const child: string[] = !childTools
    ? []
    : request.scope
      ? permittedToolNames({
          workDir: request.workDir as string,
          scope: request.scope,
          readOnly: request.readOnly,
        })
      : [...CHILD_TOOL_NAMES];
  return [...child.filter((n) => !hostNames.has(n)), ...host];
}

const searchArgs = z
  .object({
    query: z.string().min(1).max(2000),
    limit: z.number().int().min(1).max(50).default(10),
  })
  .strict();

const SEARCH_PARAMETERS = Object.freeze(z.toJSONSchema(searchArgs, { io: "input" })) as Record<
  string,
  unknown
>;

const callArgs = (names: readonly string[]) =>
  z
    .object({
      name: z.enum(names as [string, ...string[]]),
      arguments: z.record(z.string(), z.unknown()).default({}),
    })
    .strict();

function parseArgs<T>(schema: z.ZodType<T>, args: unknown, tool: string): T {
  const parsed = schema.safeParse(args);
  if (!parsed.success)
    throw new CatalogError(
      "invalid_input",
      `${tool}: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
    );
  return parsed.data;
}

const SEARCH_DESCRIPTION =
  "Search the deferred tool catalog: returns matching tools with their descriptions and argument schemas. " +
  "Query with keywords, or with exact tool names separated by commas. Then call a tool with ToolCall.";
const CALL_DESCRIPTION =
  "Call a tool of the deferred catalog by name with its arguments (look its schema up with ToolSearch first).";

function searchTool(deferred: readonly TurnTool[]): TurnTool {
  const names = deferred.map((t) => t.name);
  return {
    name: TOOL_SEARCH,
    description: `${SEARCH_DESCRIPTION}\nDeferred tools: ${names.join(", ")}.`,
    parameters: SEARCH_PARAMETERS,
    async execute(args): Promise<ToolOutput> {
      const a = parseArgs(searchArgs, args, TOOL_SEARCH);
      const exact = a.query
        .split(",")
        .map((s) => s.trim())
        .filter((s) => names.includes(s));
      let found: TurnTool[];
      if (exact.length > 0) found = deferred.filter((t) => exact.includes(t.name));
      else {
        const words = a.query
          .toLowerCase()
          .split(/[^a-z0-9_]+/)
          .filter((w) => w.length > 0);
        found = deferred
          .map((t) => {
            const hay = `${t.name} ${t.description}`.toLowerCase();
            return { t, score: words.filter((w) => hay.includes(w)).length };
          })
          .filter((s) => s.score > 0)
          .sort((x, y) => y.score - x.score)
          .map((s) => s.t);
      }
      const tools = found.slice(0, a.limit).map((t) => ({
        name: t.name,
        description: t.description,
        parameters: t.parameters,
      }));
      return {
        content:
          tools.length === 0 ? `no deferred tool matches "${a.query}"` : JSON.stringify({ tools }, null, 2),
      };
    },
  };
}

function callTool(deferred: readonly TurnTool[]): TurnTool {
  const byName = new Map(deferred.map((t) => [t.name, t]));
  const schema = callArgs([...byName.keys()]);
  return {
    name: TOOL_CALL,
    description: CALL_DESCRIPTION,
    parameters: z.toJSONSchema(schema, { io: "input" }) as Record<string, unknown>,
    async execute(args, ctx: ToolContext): Promise<ToolOutput> {
      const name = typeof args.name === "string" ? args.name : "";
      const tool = byName.get(name);
      if (!tool)
        throw new CatalogError("unknown_deferred_tool", `ToolCall: no deferred tool named ${name}`, { name });
      const a = parseArgs(schema, args, TOOL_CALL);
      // The deferred tool is the request's own (scope-wrapped) tool: its scope and read-only checks apply.
      return tool.execute(a.arguments, ctx);
    },
  };
}

/** A request's tool list under the policy: the declared tools plus, when deferring, the deferred catalog. */
export function applyCatalog(
  request: TurnRequest,
  policy: CatalogPolicy = DEFAULT_CATALOG_POLICY,
): { request: TurnRequest; plan: CatalogPlan } {
  const plan = planCatalog(catalogNames(request), policy);
  if (!plan.deferring) return { request, plan };
  const deferredNames = new Set(plan.deferred);
  const own = request.tools.filter((t) => !policy.modelOnly.includes(t.name));
  const deferred = own.filter((t) => deferredNames.has(t.name));
  const declared = own.filter((t) => !deferredNames.has(t.name));
  return {
    request: { ...request, tools: [...declared, searchTool(deferred), callTool(deferred)] },
    plan,
  };
}

/**
 * A `SessionTurnRunner` that applies the catalog policy to every turn before the inner runner (the
 * placement: a runner process or the daemon) sees it. Wrap the delegation core's runner with it once.
 */
export function withToolCatalog(
  inner: SessionTurnRunner,
  policy: CatalogPolicy = DEFAULT_CATALOG_POLICY,
): SessionTurnRunner {
  checkPolicy(policy);
  const runner: SessionTurnRunner = {
    runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome> {
      return inner.runTurn(applyCatalog(request, policy).request, host);
    },
  };
  policies.set(runner, policy);
  return runner;
}

const policies = new WeakMap<SessionTurnRunner, CatalogPolicy>();

/** The policy a runner made by `withToolCatalog` applies (undefined for any other runner). */
export function catalogPolicyOf(runner: SessionTurnRunner): CatalogPolicy | undefined {
  return policies.get(runner);
}

/**
 * The tools a session's system prompt describes under the policy, for the turn that composes it: while
 * nothing is deferred, every tool of the request (unchanged); past the threshold, the declared tools in
 * catalog order and then the deferred catalog's own two tools (their fixed descriptions, without the list
 * of names). A deferred tool is not described in the prompt: the model finds it through ToolSearch. The
 * plan is the one `applyCatalog` makes for the same request, so the prompt names what the provider
 * request declares.
 */
export function promptToolSummaries(
  request: Pick<TurnRequest, "tools" | "scope" | "workDir" | "readOnly">,
  policy: CatalogPolicy = DEFAULT_CATALOG_POLICY,
): { name: string; description: string }[] {
  const summary = (t: { name: string; description: string }) => ({
    name: t.name,
    description: t.description,
  });
  const plan = planCatalog(catalogNames(request), policy);
  if (!plan.deferring) return request.tools.map(summary);
  const deferred = new Set(plan.deferred);
  return [
    ...request.tools.filter((t) => !policy.modelOnly.includes(t.name) && !deferred.has(t.name)).map(summary),
    { name: TOOL_SEARCH, description: SEARCH_DESCRIPTION },
    { name: TOOL_CALL, description: CALL_DESCRIPTION },
  ];
}

/**
 * What parity fingerprints pin: the policy and the deferred catalog's own tool texts and schemas. Any
 * change to either changes this digest.
 */
export function catalogPolicyFingerprint(policy: CatalogPolicy = DEFAULT_CATALOG_POLICY): {
  digest: string;
  pinned: Record<string, unknown>;
} {
  const pinned = {
    version: policy.version,
    maxDirectTools: policy.maxDirectTools,
    core: [...policy.core],
    modelOnly: [...policy.modelOnly],
    search: { description: SEARCH_DESCRIPTION, parameters: z.toJSONSchema(searchArgs, { io: "input" }) },
    call: {
      description: CALL_DESCRIPTION,
      parameters: z.toJSONSchema(callArgs(["<deferred names>"]), { io: "input" }),
    },
  };
  return { digest: createHash("sha256").update(JSON.stringify(pinned)).digest("hex"), pinned };
}
