import { removeScratchDirs } from "@crw/tools/scratch";
import { afterAll } from "vitest";

// Each test file's scratch directories go when its tests end.
afterAll(() => removeScratchDirs());
