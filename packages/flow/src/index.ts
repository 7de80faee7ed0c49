export type * from "./host/sessionHost.js";
