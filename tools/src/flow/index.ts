export { type CrashCheck, checkResumedRun, faultPointsOf, type RowLike } from "./crashDriver.js";
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
