import { appendFileSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { executeRun, FlowError } from "@crw/flow";
import { afterEach, describe, expect, it } from "vitest";
import { defineWorkflow, type InProcessRun, inProcessRun, countSchema as schema } from "./helpers/harness.js";

let run: InProcessRun | null = null;
afterEach(async () => {
  await run?.close();
  run = null;
});

const one = () =>
  defineWorkflow({ name: "one", run: (ctx) => ctx.call({ role: "explorer", task: "count", schema }) });

/** Runs the workflow until its one call is held (a failed turn), leaving a journal to resume. */
async function heldRun(r: InProcessRun): Promise<void> {
  const { done } = r.background(one());
  const s1 = await r.firstStep();
  const a = r.spawn(s1, "explorer");
  await r.report(s1, a.threadId);
  r.fake.failTurn(a.threadId, "internalServerError");
  await done;
}

describe("resuming a run process on its journal", () => {
  it("refuses a resume on another backend than the started row's, exit 2, before writing any row", async () => {
    run = await inProcessRun();
    await heldRun(run);
    const before = readFileSync(run.paths.journal, "utf8");
    const r = run;
    const err = await executeRun({
      paths: r.paths,
      spec: { ...r.spec, backend: "app-server" },
      host: r.host,
      processToken: null,
      workflow: one(),
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FlowError);
    expect((err as FlowError).code).toBe("mixed_backend");
    expect((err as FlowError).exitCode).toBe(2);
    expect((err as FlowError).message).toContain("runs on the session backend");
    expect(readFileSync(r.paths.journal, "utf8")).toBe(before);
  });

  it("cuts a torn last line off, warns with its size, and goes on from the whole rows", async () => {
    run = await inProcessRun();
    await heldRun(run);
    const whole = statSync(run.paths.journal).size;
    const torn = '{"seq":99,"at":"x","type":"run_pa';
    appendFileSync(run.paths.journal, torn);
    const { done, events } = run.background(one());
    const s2 = await run.steps(1);
    expect(s2.length).toBeGreaterThanOrEqual(1);
    expect(events).toContainEqual({
      type: "warning",
      message: `journal: a torn last line (${Buffer.byteLength(torn)} bytes) was cut off and ignored`,
    });
    expect(readFileSync(run.paths.journal, "utf8").slice(0, whole)).not.toContain('"seq":99');
    expect(run.rows().map((r) => r.type)).toContain("held");
    const after = run.rows();
    expect(after.map((r) => r.seq)).toEqual(after.map((_, i) => i));
    void done.catch(() => undefined);
  });

  it("a journal that cannot be read for another reason than its absence is an error, not a new run", async () => {
    run = await inProcessRun();
    mkdirSync(run.paths.journal, { recursive: true });
    const r = run;
    const err = await executeRun({
      paths: r.paths,
      spec: r.spec,
      host: r.host,
      processToken: null,
      workflow: one(),
    }).catch((e: unknown) => e);
    expect((err as NodeJS.ErrnoException).code).toBe("EISDIR");
    expect(statSync(r.paths.journal).isDirectory()).toBe(true);
  });
});
