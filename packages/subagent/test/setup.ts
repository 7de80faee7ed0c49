import { afterAll } from "vitest";
import { removeTempDirs } from "./support/tmp.js";

// Each test file's scratch directories go when its tests end.
afterAll(() => removeTempDirs());
