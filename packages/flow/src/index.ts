export * from "./host/index.js";
export type * from "./host/sessionHost.js";
