// The test kits the engine benchmark bundles (see flow-engine.mjs).
export { FakeAppServer } from "../tools/src/codex/index.js";
export { fileStepSource, ScriptedOwner } from "../tools/src/flow/index.js";
