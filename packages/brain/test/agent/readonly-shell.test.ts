import { describe, expect, it } from "vitest";
import { isReadOnlyCommand } from "../../src/agent/index.js";

describe("read-only shell clamp", () => {
  it("accepts pipelines of non-mutating commands", () => {
    for (const ok of [
      "ls -la",
      "cat a.txt | wc -l",
      "git status",
      "git log --oneline -5",
      "rg TODO src",
      "find . -name x.ts",
      "sort a | head -3",
    ]) {
      expect(isReadOnlyCommand(ok), ok).toBe(true);
    }
  });

  it("refuses redirection, substitution, lists, unknown programs and flags that write or run programs", () => {
    for (const bad of [
      "echo x > f",
      "cat < f",
      "ls; rm -rf /",
      "ls && touch x",
      "echo $(rm x)",
      "echo `rm x`",
      "rm -rf x",
      "touch x",
      "find . -delete",
      "find . -exec rm {} +",
      "sort -o out a",
      "sort --compress-program=sh a",
      "rg --pre ./evil TODO",
      "tree -o out",
      "file -C",
      "git -c core.pager=sh log",
      "git --exec-path=/tmp status",
      "git diff --ext-diff",
      "git grep -Ovim x",
      "git diff --output=f",
      "git push",
      "git checkout .",
      "cat a.txt | tee b.txt",
      "",
    ]) {
      expect(isReadOnlyCommand(bad), bad).toBe(false);
    }
  });
});
