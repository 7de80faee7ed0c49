// Shared flow bench setup: the TypeScript test kits (fake app-server, scripted owner, step source) bundled
// with esbuild into node_modules/.cache, then imported; the run's files; an event-driven owner source.
import { existsSync, mkdirSync, unlinkSync, watch } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";

export const repoRoot = new URL("../..", import.meta.url).pathname;

/** Bundles the kits (unless `build` is false: a worker thread of a bench that bundled them) and imports them. */
export async function loadFlowKits({ build: rebuild = true } = {}) {
  // inside the repository, so that the bundle's external imports resolve from its node_modules
  const outdir = join(repoRoot, "node_modules", ".cache", "crw-bench-flow-engine");
  if (rebuild) await bundle(outdir);
  return import(join(outdir, "kits.js"));
}

async function bundle(outdir) {
  await build({
    entryPoints: { kits: join(repoRoot, "bench/.flow-engine-kits.ts") },
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    outdir,
    external: ["@crw/flow", "ws", "zod"],
    logLevel: "error",
  });
}

/**
 * Writes the run directory and run.json of a session-backend run `runId` under `root`/state, its owner a
 * thread of the fake app-server `fake` and its repository `root`. `extra` adds or overrides spec fields.
 */
export function writeSessionRun(flow, { root, runId, fake, owner, pool, extra = {} }) {
  const paths = flow.runPaths(join(root, "state"), runId);
  mkdirSync(paths.dir, { recursive: true });
  const spec = {
    format: flow.SPEC_FORMAT,
    run_id: runId,
    workflow: join(root, "w.mjs"),
    workflow_name: runId,
    input: null,
    backend: "session",
    owner,
    pool,
    repo: root,
    host: fake.url,
    created_at: new Date().toISOString(),
    ...extra,
  };
  flow.writeSpec(paths.spec, spec);
  return { paths, spec };
}

/**
 * The owner's side of a session run, driven by events: what the scripted owner's file source does (take
 * the step and close files, write the dispatch report, read the reply), but it reads a call's directory
 * when fs.watch says it changed and a reply when the replies directory changed, instead of listing every
 * call's directory and reading the whole journal every millisecond. A full listing (and the run's state)
 * every `pollMs` is the fallback for a missed event (and the reply is read again at that bound too). In-process benches only: `close()` ends the watches.
 */
export function watchedStepSource(flow, { state, runId, pollMs = 250, replyWaitMs = 20_000 }) {
  const paths = flow.runPaths(state, runId);
  mkdirSync(paths.steps, { recursive: true });
  mkdirSync(paths.replies, { recursive: true });
  const dirty = new Set();
  let full = { at: 0, state: "running" };
  const waiters = new Set();
  const poke = () => {
    for (const w of [...waiters]) w();
  };
  // A watch of steps/ (a call's directory made or removed) and one of each call's directory (its step and
  // close files). Not `recursive: true`: on Linux, Node 20 implements it by listing and stat-ing the whole
  // tree again at every event, which costs more than the engine it stands beside.
  const callWatches = new Map();
  const watchCall = (call) => {
    if (callWatches.has(call)) return;
    try {
      const w = watch(join(paths.steps, call), { persistent: false }, () => {
        dirty.add(call);
        poke();
      });
      w.on("error", () => unwatchCall(call));
      callWatches.set(call, w);
    } catch (e) {
      if (e.code !== "ENOENT") throw e;
    }
    // files written before the watch began are listed at the next take
    dirty.add(call);
  };
  const unwatchCall = (call) => {
    callWatches.get(call)?.close();
    callWatches.delete(call);
  };
  const stepsWatch = watch(paths.steps, (_event, name) => {
    if (!name) return poke();
    const call = String(name);
    if (existsSync(join(paths.steps, call))) watchCall(call);
    else unwatchCall(call);
    dirty.add(call);
    poke();
  });
  const repliesWatch = watch(paths.replies, () => poke());
  // until a watch fires or `ms` pass; the timer goes with the wait
  const changed = (ms) =>
    new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      waiters.add(done);
    });
  const source = {
    async take() {
      if (dirty.size === 0 && Date.now() - full.at < pollMs) await changed(pollMs);
      const listed = { steps: [], closes: [], bad: [] };
      if (Date.now() - full.at >= pollMs) {
        dirty.clear();
        Object.assign(listed, flow.listStepFiles(paths.steps));
        for (const call of listed.steps.map((x) => x.call)) watchCall(call);
        full = { at: Date.now(), state: flow.readRunState(paths, listed.steps.length > 0).kind };
      } else {
        const calls = [...dirty].sort();
        dirty.clear();
        for (const call of calls) flow.listCallStepFiles(paths.steps, call, listed);
      }
      const steps = [];
      for (const c of listed.closes) {
        removeFile(c.path);
        steps.push({ ...c, k: 0, op: `${c.call}/close`, role: "", action: "close" });
      }
      for (const s of listed.steps) steps.push({ ...s });
      return { state: full.state, steps };
    },
    async report(step, agentId) {
      const name = flow.reportName(step.call, step.k, step.attempt, agentId);
      removeFile(join(paths.replies, name));
      flow.writeReport(paths.inbox, {
        format: "crw-flow-dispatch/1",
        run_id: runId,
        call: step.call,
        k: step.k,
        attempt: step.attempt,
        agent_id: agentId,
        at: new Date().toISOString(),
      });
      const deadline = Date.now() + replyWaitMs;
      while (Date.now() < deadline) {
        const reply = flow.readReply(paths.replies, name);
        if (reply) return reply.reply;
        await changed(pollMs);
      }
      return "queued";
    },
    close() {
      stepsWatch.close();
      for (const call of [...callWatches.keys()]) unwatchCall(call);
      repliesWatch.close();
      poke();
    },
  };
  return source;
}

function removeFile(path) {
  try {
    unlinkSync(path);
  } catch (e) {
    if (e.code !== "ENOENT") throw e;
  }
}
