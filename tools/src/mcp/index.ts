import { fileURLToPath } from "node:url";

/**
 * A real MCP server over stdio for tests and benches: `node <MCP_TOOLS_SERVER> <N>` serves N tools (see the
 * file's header for its switches). One source for the bridge's own tests, the daemon suites and the benches.
 */
export const MCP_TOOLS_SERVER = fileURLToPath(new URL("./tools-server.mjs", import.meta.url));
