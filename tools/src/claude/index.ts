export {
  type ClaudeMcpServer,
  type ClaudeRun,
  claudeBin,
  claudeMcpConfig,
  type RunClaudeOptions,
  runClaude,
} from "./runClaude.js";
