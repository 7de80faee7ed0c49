import { afterAll } from "vitest";
import { removeScratchDirs } from "./helpers/scratch.js";

// Each test file's scratch directories go when its tests end.
afterAll(() => removeScratchDirs());
