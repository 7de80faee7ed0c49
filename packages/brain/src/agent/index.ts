export { fromPiMessage, toPiMessage } from "./convert.js";
export {
  AgentConfigError,
  type AgentConfigErrorCode,
  type ErrorData,
  errorData,
  type SandboxUnavailableCode,
  SandboxUnavailableError,
  type ToolCallRefusedCode,
  ToolCallRefusedError,
} from "./errors.js";
export {
  ASK_USER_GUIDANCE,
  composeInteractivePrompt,
  composeWorkerPrompt,
  escapeAccountInstructions,
  type ForkPrefix,
  forkPrefix,
  PERSONA_TEMPLATES,
  type PromptFragment,
  PromptFragmentRegistry,
  type PromptInputs,
  type PromptRoute,
  personaTemplatesFor,
  REVIEW_ROLE,
  registerAskUserGuidance,
  selectPromptRoute,
  sessionPromptFragments,
  type ToolSummary,
} from "./prompt.js";
export {
  loadPi,
  type ModelConfig,
  ModelConfigSchema,
  type PiModules,
  parseModelConfig,
  type ResolvedModel,
  type ResolvedModelConfig,
  resolveModel,
} from "./providers.js";
export {
  type AgentTurnRunnerOptions,
  createAgentTurnRunner,
  type ModelCatalogOptions,
  modelConfigFor,
  type ProviderUsageReport,
} from "./runner.js";
export {
  SCRIPTED_API,
  type ScriptStep,
  ScriptStepSchema,
  scriptedReply as scriptedProviderReply,
} from "./scripted.js";
export { type SessionPromptOptions, sessionSystemPrompt } from "./session-prompt.js";
export {
  CHILD_TOOL_NAMES,
  type CheckedCall,
  type ChildToolName,
  type ChildToolOptions,
  checkChildToolCall,
  childToolSummaries,
  createChildTools,
  effectiveReadOnly,
  permittedToolNames,
} from "./tools.js";
export {
  type ChildTurnHooks,
  type ChildTurnInput,
  type ChildTurnOutcome,
  type ChildTurnProgress,
  type ChildTurnStopReason,
  type HostTool,
  providerUsageOf,
  runChildTurn,
  type ToolCallRecord,
  type ToolIntent,
  type TurnUsage,
} from "./turn.js";
