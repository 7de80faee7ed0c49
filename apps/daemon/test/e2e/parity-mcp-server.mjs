// The daemon's suites use the bridge's own test MCP server (packages/brain/src/mcp/fixtures), one source
// for both: `node parity-mcp-server.mjs <N>` behaves exactly as `tools-server.mjs <N>`.
import "../../../../packages/brain/src/mcp/fixtures/tools-server.mjs";
