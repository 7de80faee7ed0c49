/**
 * Session prompt composition. A fresh worker (an ordinary, non-fork delegated child, whatever role the
 * plugin resolved) gets the `crw-engineering` foundation plus the `delegated/worker` contract; it gets no
 * conversational identity, memory guidance, chat style, shared-room overlay or recalled memories. Its
 * append order is stable: model identity, tool catalog, projected plugin fragments, role/context from the
 * durable scope, then the account's instructions, escaped. Project context and the working directory are
 * not part of it: the resource loader adds them. Composition is a pure function, run once per spawn, and
 * calls no provider. A fork does not compose at all: it continues with its parent's byte-identical prefix.
 */

export type PromptRoute = "worker" | "fork" | "interactive" | "scheduled" | "dream" | "skill-review";

/** How a new session's prompt is chosen. Forks keep their parent's; every ordinary child is a worker. */
export function selectPromptRoute(spawn: {
  readonly fork?: boolean;
  readonly purpose?: "delegate" | "interactive" | "scheduled" | "dream" | "skill-review";
  readonly role?: string;
}): PromptRoute {
  if (spawn.fork) return "fork";
  switch (spawn.purpose) {
    case "interactive":
    case "scheduled":
    case "dream":
    case "skill-review":
      return spawn.purpose;
    default:
      // A typed role and a generic role both land here: the role is appended, never a different foundation.
      return "worker";
  }
}

export const PERSONA_TEMPLATES: Readonly<Record<string, string>> = {
  "crw-engineering": [
    "You are a software engineering agent working inside crw.",
    "Work from evidence: read the code and run the checks before you claim a result.",
    "Prefer small, correct changes; say plainly what you did not verify.",
  ].join("\n"),
  "delegated/worker": [
    "# Worker contract",
    "You were started by a parent session to do one delegated task. The parent, not a person, reads your answer.",
    "Scope: do the task you were given inside your working directory and granted tools; do not widen it.",
    "Evidence: base every claim on what you read or ran, and name the files and commands.",
    "Reporting: end with a concise report for the parent: what you did, what you found, what is left.",
    "Blockers: when something stops you (a refused tool, a missing file, an unclear task), stop and report the blocker instead of guessing.",
  ].join("\n"),
  conversational: [
    "# Identity",
    "You are crw's conversational assistant for this account. Speak to the person directly and warmly.",
  ].join("\n"),
  memory: [
    "# Memory",
    "When the person tells you something worth keeping, write it to memory with the memory tools.",
  ].join("\n"),
  "chat-style": ["# Style", "Keep replies short and conversational; ask before long work."].join("\n"),
  "shared-room": ["# Shared room", "Several people may be present; address the one who spoke."].join("\n"),
};

/** The persona templates for a route. Plugin templates are appended later as role text; they never replace these. */
export function personaTemplatesFor(route: PromptRoute): readonly string[] {
  switch (route) {
    case "worker":
      return ["crw-engineering", "delegated/worker"];
    case "interactive":
      return ["crw-engineering", "conversational", "memory", "chat-style"];
    default:
      return ["crw-engineering"];
  }
}

export interface PromptFragment {
  readonly source: string;
  readonly text: string;
  /** Guidance for an interactive user (AskUser's): dropped for fresh workers only. */
  readonly interactiveOnly: boolean;
  /** Shown only when this tool is in the session's catalog (how SkillLoad's fragment is filtered). */
  readonly tool?: string;
}

/** Where plugins register prompt text, in registration order. */
export class PromptFragmentRegistry {
  readonly #fragments: PromptFragment[] = [];

  registerText(
    kind: "system-prompt",
    text: string,
    options: { interactiveOnly?: boolean; tool?: string; source?: string } = {},
  ): void {
    if (kind !== "system-prompt") throw new TypeError(`unknown prompt fragment kind ${String(kind)}`);
    this.#fragments.push({
      source: options.source ?? "plugin",
      text,
      interactiveOnly: options.interactiveOnly === true,
      ...(options.tool ? { tool: options.tool } : {}),
    });
  }

  get fragments(): readonly PromptFragment[] {
    return this.#fragments;
  }
}

export const ASK_USER_GUIDANCE =
  "When you need a decision only the person can make, ask them with AskUser and wait for the answer.";

/** AskUser's guidance is interactive-user guidance: it registers with `interactiveOnly`. */
export function registerAskUserGuidance(registry: PromptFragmentRegistry): void {
  registry.registerText("system-prompt", ASK_USER_GUIDANCE, { interactiveOnly: true, source: "AskUser" });
}

/**
 * The fragments a session shows, in registration order: `interactiveOnly` ones are dropped for fresh
 * workers only, and a fragment bound to a tool (SkillLoad's) appears only with that tool. Text only:
 * which tools the session may call is decided by its scope, never here.
 */
export function sessionPromptFragments(
  fragments: readonly PromptFragment[],
  session: { readonly freshWorker: boolean; readonly toolNames: readonly string[] },
): PromptFragment[] {
  return fragments.filter(
    (f) =>
      !(session.freshWorker && f.interactiveOnly) &&
      (f.tool === undefined || session.toolNames.includes(f.tool)),
  );
}

/** Makes account instructions inert text inside their section: no tag they contain can close it. */
export function escapeAccountInstructions(text: string): string {
  return text.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

export const REVIEW_ROLE = [
  "# Role: review",
  "Review only; do not edit files (this is a prompt rule: your tools are inherited unchanged).",
  "Report each finding as a concrete, reachable defect: where it is, how it is reached, what goes wrong.",
  "Zero findings is a valid result; do not invent findings to have some.",
].join("\n");

export interface ToolSummary {
  readonly name: string;
  readonly description: string;
}

export interface PromptInputs {
  readonly model: { readonly id: string; readonly provider?: string };
  readonly tools: readonly ToolSummary[];
  readonly fragments?: readonly PromptFragment[];
  /** From the durable scope. */
  readonly role?: string;
  readonly context?: string;
  /** Plugin-supplied role template text (e.g. a typed agent definition): appended as the role, never the foundation. */
  readonly roleTemplate?: string;
  readonly accountInstructions?: string;
  /** The eligible project instruction files, already composed as a section (see `instructionSection`). */
  readonly projectInstructions?: string;
  /** Interactive sessions only. */
  readonly recalledMemories?: readonly string[];
  readonly sharedRoom?: boolean;
}

function roleText(inputs: PromptInputs): string | undefined {
  const parts: string[] = [];
  if (inputs.role === "review") parts.push(REVIEW_ROLE);
  else if (inputs.role) parts.push(`# Role: ${inputs.role}`);
  if (inputs.roleTemplate) parts.push(inputs.roleTemplate);
  if (inputs.context) parts.push(`# Context from the delegating session\n${inputs.context}`);
  return parts.length ? parts.join("\n\n") : undefined;
}

function appendSections(route: "worker" | "interactive", inputs: PromptInputs): string[] {
  const sections: string[] = [];
  sections.push(
    `# Model\nYou are running as ${inputs.model.id}${inputs.model.provider ? ` (${inputs.model.provider})` : ""}.`,
  );
  if (inputs.tools.length)
    sections.push(`# Tools\n${inputs.tools.map((t) => `- ${t.name}: ${t.description}`).join("\n")}`);
  const fragments = sessionPromptFragments(inputs.fragments ?? [], {
    freshWorker: route === "worker",
    toolNames: inputs.tools.map((t) => t.name),
  });
  if (fragments.length) sections.push(fragments.map((f) => f.text).join("\n\n"));
  const role = roleText(inputs);
  if (role) sections.push(role);
  if (inputs.projectInstructions) sections.push(inputs.projectInstructions);
  if (inputs.accountInstructions) {
    sections.push(
      `<account-instructions>\n${escapeAccountInstructions(inputs.accountInstructions)}\n</account-instructions>`,
    );
  }
  return sections;
}

/** A fresh worker's system prompt. */
export function composeWorkerPrompt(inputs: PromptInputs): string {
  const persona = personaTemplatesFor("worker").map((name) => PERSONA_TEMPLATES[name] as string);
  return [...persona, ...appendSections("worker", inputs)].join("\n\n");
}

/** An interactive session's prompt: the conversational layers a worker does not get. */
export function composeInteractivePrompt(inputs: PromptInputs): string {
  const persona = personaTemplatesFor("interactive").map((name) => PERSONA_TEMPLATES[name] as string);
  if (inputs.sharedRoom) persona.push(PERSONA_TEMPLATES["shared-room"] as string);
  const memories = inputs.recalledMemories?.length
    ? [`# Recalled memories\n${inputs.recalledMemories.map((m) => `- ${m}`).join("\n")}`]
    : [];
  return [...persona, ...memories, ...appendSections("interactive", inputs)].join("\n\n");
}

/** What a fork inherits: the parent's exact system prompt, tool set and transcript prefix. */
export interface ForkPrefix<M> {
  readonly systemPrompt: string;
  readonly toolNames: readonly string[];
  readonly messages: readonly M[];
}

/** A fork continues with its parent's byte-identical prefix and toolset; nothing is recomposed. */
export function forkPrefix<M>(parent: ForkPrefix<M>): ForkPrefix<M> {
  return {
    systemPrompt: parent.systemPrompt,
    toolNames: [...parent.toolNames],
    messages: structuredClone([...parent.messages]),
  };
}
