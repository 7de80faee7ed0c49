import { afterAll } from "vitest";
import { removeMade } from "./support/readme.js";

// Each test file's scratch directories (a README run's clone and home) go when its tests end.
afterAll(() => removeMade());
