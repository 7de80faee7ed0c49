import { afterAll } from "vitest";
import { removeSpillDirs } from "./delegation/helpers.js";

// Each test file's spill directories go when its tests end.
afterAll(() => removeSpillDirs());
