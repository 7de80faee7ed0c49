export {
  type Behave,
  cliStepSource,
  fileStepSource,
  type OwnerStep,
  ScriptedOwner,
  type ScriptedOwnerOptions,
  type StepSource,
  type SubagentTurn,
} from "./scriptedOwner.js";
