import { afterAll } from "vitest";
import { removeScratchDirs } from "./delegation/helpers.js";

// Each test file's scratch directories (spill roots among them) go when its tests end.
afterAll(() => removeScratchDirs());
