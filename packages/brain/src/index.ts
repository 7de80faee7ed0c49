export * from "./agent/index.js";
export * from "./delegation/index.js";
export * from "./scope/index.js";
