export * from "./agent/catalog/index.js";
export * from "./agent/index.js";
export * from "./delegation/index.js";
export * from "./mcp/index.js";
export * from "./scope/index.js";
