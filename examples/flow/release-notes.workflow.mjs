// A crw flow workflow: plan release notes, draft two sections in parallel, write the notes, review them.
// Run it offline on the local backend with the scripted model (no account, no network):
//
//   crw flow start examples/flow/release-notes.workflow.mjs --backend local \
//     --script examples/flow/release-notes.script.json --input '{"version":"1.2.0"}'
//   crw flow show <run>
//
// With a real provider: --model openai-responses:<model id> (OPENAI_API_KEY) instead of --script.
// In a git repository (--repo, default the current directory) the run works on the branch crw/flow/<run>:
// the executor's NOTES.md is committed there, the reviewer reads it, and `crw flow land <run>` brings it
// onto the branch the run started from.

const plan = {
  type: "object",
  properties: {
    title: { type: "string" },
    sections: { type: "array", items: { type: "string" }, minItems: 2, maxItems: 2 },
  },
  required: ["title", "sections"],
  additionalProperties: false,
};

const section = {
  type: "object",
  properties: { section: { type: "string" }, bullets: { type: "array", items: { type: "string" } } },
  required: ["section", "bullets"],
  additionalProperties: false,
};

const written = {
  type: "object",
  properties: { file: { type: "string" }, bullets: { type: "integer", minimum: 0 } },
  required: ["file", "bullets"],
  additionalProperties: false,
};

const review = {
  type: "object",
  properties: { verdict: { enum: ["approve", "revise"] }, notes: { type: "string" } },
  required: ["verdict", "notes"],
  additionalProperties: false,
};

export default {
  name: "release-notes",
  async run(ctx, input) {
    const version = input?.version ?? "0.0.0";
    const p = await ctx.call({
      role: "architect",
      node: "plan",
      task: `Plan the release notes of version ${version}: a title and exactly two sections.`,
      schema: plan,
    });
    // the parallel pair: both sections are drafted at once
    const drafts = await Promise.all(
      p.sections.map((name) =>
        ctx.call({
          role: "explorer",
          node: "draft",
          task: `Draft the "${name}" section of the ${version} release notes as short bullets.`,
          schema: section,
        }),
      ),
    );
    // callWithWork: the answer, and what the call changed on the run's branch (its commit and paths)
    const { answer: notes, work } = await ctx.callWithWork({
      role: "executor",
      node: "write",
      task: [
        `Write NOTES.md in your workspace: "# ${p.title}", then each section with its bullets.`,
        ...drafts.map((d) => `${d.section}: ${d.bullets.join("; ")}`),
      ].join("\n"),
      schema: written,
    });
    // the reviewer's checkout starts from the executor's commit: the file is there to read
    const changed = work ? work.paths.join(", ") : notes.file;
    const verdict = await ctx.call({
      role: "reviewer",
      node: "review",
      task: `Review ${notes.file} (${notes.bullets} bullets) for the ${version} release; the writer changed ${changed}. Read it in your checkout.`,
      schema: review,
    });
    return {
      title: p.title,
      sections: drafts.map((d) => d.section),
      file: notes.file,
      verdict: verdict.verdict,
    };
  },
};
