/**
 * The command groups of `crw`. Each group's module is imported only when its group runs, so that a command
 * the owner runs once per step (`crw flow next`) loads nothing it does not use.
 */
export interface CommandGroup {
  name: string;
  summary: string;
  run?: (args: string[]) => Promise<number>;
}

export const groups: CommandGroup[] = [
  {
    name: "flow",
    summary: "run a workflow durably as session calls (start, next, dispatched, resume, show, …)",
    // The owner runs `crw flow next` once per step: "@crw/flow/cli" loads no engine, host or zod.
    run: async (args) => (await import("@crw/flow/cli")).runFlowCli(args),
  },
  {
    name: "daemon",
    summary: "start, stop or inspect the delegation daemon",
    run: async (args) => (await import("./daemon/command.js")).runDaemonCli(args),
  },
  {
    name: "workflow",
    summary: "submit a workflow definition to the daemon and follow it",
    run: async (args) => (await import("./client/workflow.js")).runWorkflowCli(args),
  },
  {
    name: "session",
    summary: "talk to a daemon session: send, delegate, read, status, fork-prefix",
    run: async (args) => (await import("./client/session.js")).runSessionCli(args),
  },
  {
    name: "project",
    summary: "register directories as projects and grant them to accounts",
    run: async (args) => (await import("./client/project.js")).runProjectCli(args),
  },
  {
    name: "account",
    summary: "make accounts and set their tool grants (owner and administrators)",
    run: async (args) => (await import("./client/accounts.js")).runAccountCli(args),
  },
  {
    name: "token",
    summary: "issue, list and revoke API tokens (owner and administrators)",
    run: async (args) => (await import("./client/accounts.js")).runTokenCli(args),
  },
  {
    name: "mcp",
    summary: "serve crw's tools to an MCP client (Codex, Claude Code); install its configuration",
    run: async (args) => (await import("./mcp/command.js")).runMcpCli(args),
  },
  {
    name: "tap",
    summary: "follow a delegated child session live",
    run: async (args) => (await import("./client/tap.js")).runTapCli(args),
  },
];
