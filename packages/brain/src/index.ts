export * from "./agent/catalog/index.js";
export * from "./agent/index.js";
export * from "./delegation/index.js";
export * from "./mcp/index.js";
export * from "./scope/index.js";
// Workspace: isolated child worktrees on branches of their own, crw's commits of what a child left, landing by merge.
export * from "./workspace/index.js";
