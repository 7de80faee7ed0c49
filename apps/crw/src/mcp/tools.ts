/**
 * The tools crw offers an MCP client, as the client's model sees them: names, descriptions and JSON Schemas
 * written so a model can use them without reading any documentation.
 */

export interface ToolDefinition {
  readonly name: string;
  readonly description: string;
  readonly inputSchema: {
    readonly type: "object";
    readonly properties: Record<string, unknown>;
    readonly required?: readonly string[];
    readonly additionalProperties: false;
  };
  readonly annotations?: { readonly readOnlyHint?: boolean; readonly destructiveHint?: boolean };
}

const uuid = (what: string) => ({ type: "string", format: "uuid", description: what });

export const TOOLS: readonly ToolDefinition[] = [
  {
    name: "delegate",
    description:
      "Hand a task to a crw sub-agent that works in a directory with coding tools (read, write, edit, shell in a sandbox). " +
      "crw keeps the work durable: if anything crashes it resumes, and its result is delivered exactly once. " +
      "Foreground (default): waits and returns the sub-agent's answer. Background: returns the child id at once; " +
      "collect the answer later with `results`. Use background for anything that may take more than a minute.",
    inputSchema: {
      type: "object",
      properties: {
        task: { type: "string", description: "What the sub-agent should do, in full: it sees nothing else." },
        cwd: {
          type: "string",
          description:
            "The directory it works in: absolute, or relative to this session's directory (default: this session's directory).",
        },
        background: { type: "boolean", description: "Return at once; the answer comes through `results`." },
        isolation: {
          type: "string",
          enum: ["none", "worktree"],
          description:
            "`worktree`: work on a git branch of its own (merge it later with `land`); `none` (default): edit the directory itself.",
        },
        model: { type: "string", description: "The model the sub-agent runs on (default: the daemon's)." },
        read_only: { type: "boolean", description: "The sub-agent may read but not change anything." },
      },
      required: ["task"],
      additionalProperties: false,
    },
  },
  {
    name: "continue",
    description:
      "Send a follow-up to a sub-agent you delegated to (by its child id): it continues with everything it did so far. " +
      "Foreground by default; with background, the answer comes through `results`.",
    inputSchema: {
      type: "object",
      properties: {
        child: uuid("The child id `delegate` returned."),
        text: { type: "string", description: "The follow-up instruction." },
        background: { type: "boolean", description: "Return at once; the answer comes through `results`." },
      },
      required: ["child", "text"],
      additionalProperties: false,
    },
  },
  {
    name: "read",
    description:
      "Read a sub-agent's conversation so far (its latest answer and recent messages) without disturbing it.",
    inputSchema: {
      type: "object",
      properties: {
        child: uuid("The child id."),
        limit: {
          type: "integer",
          minimum: 1,
          maximum: 200,
          description: "How many recent messages (default 20).",
        },
      },
      required: ["child"],
      additionalProperties: false,
    },
  },
  {
    name: "results",
    description:
      "Collect the answers of background sub-agents and workflows of this session that you have not collected yet. " +
      "Each answer is given exactly once. With nothing waiting, waits up to `wait_seconds` for the next one. " +
      "If you lost answers you had collected (a crash), pass `include_taken_since` to see them again, marked as already taken.",
    inputSchema: {
      type: "object",
      properties: {
        wait_seconds: {
          type: "number",
          minimum: 0,
          maximum: 300,
          description: "How long to wait when nothing is waiting (default 0: answer at once).",
        },
        include_taken_since: {
          type: "string",
          format: "date-time",
          description: "An ISO 8601 time: also list the answers already collected since then.",
        },
      },
      additionalProperties: false,
    },
    annotations: { readOnlyHint: false },
  },
  {
    name: "status",
    description:
      "List this session's sub-agents and workflows: what each is doing, where it runs, its directory and branch.",
    inputSchema: { type: "object", properties: {}, additionalProperties: false },
    annotations: { readOnlyHint: true },
  },
  {
    name: "workflow_start",
    description:
      "Start a crw workflow (a DAG of sub-agent nodes, YAML or JSON) in the background. Its summary arrives through `results`. " +
      "Give the definition inline or a file path.",
    inputSchema: {
      type: "object",
      properties: {
        definition: { type: "string", description: "The workflow definition text." },
        path: { type: "string", description: "A definition file (relative to this session's directory)." },
        format: {
          type: "string",
          enum: ["yaml", "json"],
          description: "Default: from the file name, else yaml.",
        },
        cwd: { type: "string", description: "The workflow's directory (default: this session's)." },
      },
      additionalProperties: false,
    },
  },
  {
    name: "workflow_status",
    description: "A workflow's state and the state of each of its nodes.",
    inputSchema: {
      type: "object",
      properties: { workflow: uuid("The workflow id `workflow_start` returned.") },
      required: ["workflow"],
      additionalProperties: false,
    },
    annotations: { readOnlyHint: true },
  },
  {
    name: "workflow_cancel",
    description: "Stop a running workflow; its summary (cancelled) arrives through `results`.",
    inputSchema: {
      type: "object",
      properties: { workflow: uuid("The workflow id.") },
      required: ["workflow"],
      additionalProperties: false,
    },
    annotations: { destructiveHint: true },
  },
  {
    name: "land",
    description:
      "Merge the git branch of a sub-agent that worked in isolation (`isolation: worktree`), or of a workflow, into the branch it started from.",
    inputSchema: {
      type: "object",
      properties: { child: uuid("A child id."), workflow: uuid("A workflow id.") },
      additionalProperties: false,
    },
  },
];
