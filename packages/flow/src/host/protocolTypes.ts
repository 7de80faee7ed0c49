/**
 * The generated protocol types crw reads and sends (wire.ts) and the fake app-server builds its threads
 * with. Importing these files, not the generated index, keeps type checks and the declaration build from
 * loading the whole generated tree (about 970 files).
 */

export type { InitializeParams } from "./generated/InitializeParams.js";
export type { InitializeResponse } from "./generated/InitializeResponse.js";
export type { CodexErrorInfo } from "./generated/v2/CodexErrorInfo.js";
export type { CollabAgentState } from "./generated/v2/CollabAgentState.js";
export type { CollabAgentTool } from "./generated/v2/CollabAgentTool.js";
export type { ConfigWarningNotification } from "./generated/v2/ConfigWarningNotification.js";
export type { SessionSource } from "./generated/v2/SessionSource.js";
export type { Thread } from "./generated/v2/Thread.js";
export type { ThreadForkParams } from "./generated/v2/ThreadForkParams.js";
export type { ThreadItem } from "./generated/v2/ThreadItem.js";
export type { ThreadListParams } from "./generated/v2/ThreadListParams.js";
export type { ThreadListResponse } from "./generated/v2/ThreadListResponse.js";
export type { ThreadReadParams } from "./generated/v2/ThreadReadParams.js";
export type { ThreadReadResponse } from "./generated/v2/ThreadReadResponse.js";
export type { ThreadResumeParams } from "./generated/v2/ThreadResumeParams.js";
export type { ThreadSourceKind } from "./generated/v2/ThreadSourceKind.js";
export type { ThreadStartParams } from "./generated/v2/ThreadStartParams.js";
export type { ThreadStartResponse } from "./generated/v2/ThreadStartResponse.js";
export type { ThreadStatus } from "./generated/v2/ThreadStatus.js";
export type { ThreadTokenUsage } from "./generated/v2/ThreadTokenUsage.js";
export type { TokenUsageBreakdown } from "./generated/v2/TokenUsageBreakdown.js";
export type { Turn } from "./generated/v2/Turn.js";
export type { TurnError } from "./generated/v2/TurnError.js";
export type { TurnInterruptParams } from "./generated/v2/TurnInterruptParams.js";
export type { TurnStartParams } from "./generated/v2/TurnStartParams.js";
export type { TurnStartResponse } from "./generated/v2/TurnStartResponse.js";
export type { UserInput } from "./generated/v2/UserInput.js";
