import { lstat, readdir, readFile, realpath } from "node:fs/promises";
import { dirname, join, relative } from "node:path";
import { posixInside } from "./paths.js";
import { projectContextRoot } from "./workdir.js";

/** An instruction file that may shape a turn, and its text (bounded). */
export interface InstructionFile {
  readonly path: string;
  readonly text: string;
}

/** Bounds of what a session's composition reads from instruction files. */
export const INSTRUCTION_LIMITS = { fileBytes: 64 * 1024, totalBytes: 256 * 1024, rules: 64 } as const;

/** The file a directory's instructions live in, and the rules folder at the instruction root. */
export const INSTRUCTION_FILE = "AGENTS.md";
export const RULES_DIR = join(".crw", "rules");

/**
 * The instruction root of a validated placement: the working tree that holds it (a linked worktree's
 * own root, never the repository it was added from), kept inside the project root when there is one (in
 * a linked worktree of the project's repository, the project's own place in that worktree); without a
 * working tree, the project root, else the directory itself.
 */
export async function instructionRootFor(workDir: string, projectRoot?: string | null): Promise<string> {
  const real = await realpath(workDir);
  const root = projectRoot ? await realpath(projectRoot).catch(() => projectRoot) : null;
  const context = await projectContextRoot(real);
  if (!context) return root ?? real;
  if (root === null || posixInside(root, context.root)) return context.root;
  // A linked worktree of the project's repository: the project's place inside this worktree.
  if (context.repositoryRoot !== context.root && posixInside(context.repositoryRoot, root)) {
    const mapped = join(context.root, relative(context.repositoryRoot, root));
    if (posixInside(mapped, real)) return mapped;
  }
  return root;
}

/**
 * The owner-ancestor rule: the instruction files a turn placed at `workDir` may read are those of its
 * instruction root and of every directory between that root and `workDir` (root first, the most specific
 * last), plus the root's rules folder. Nothing above the root (an enclosing repository, the origin of a
 * worktree), beside the path (a sibling directory) or below `workDir` is eligible; symbolic links and
 * non-regular files are skipped. A placement outside its root is given no instructions at all.
 */
export async function eligibleInstructionFiles(
  workDir: string,
  instructionRoot: string,
): Promise<InstructionFile[]> {
  const dir = await realpath(workDir);
  const root = await realpath(instructionRoot);
  if (!posixInside(root, dir)) return [];
  const chain: string[] = [];
  for (let d = dir; ; d = dirname(d)) {
    chain.unshift(d);
    if (d === root || dirname(d) === d) break;
  }
  const files: InstructionFile[] = [];
  let total = 0;
  const take = async (path: string) => {
    const info = await lstat(path).catch(() => undefined);
    if (!info?.isFile()) return;
    const bytes = await readFile(path);
    const room = Math.min(INSTRUCTION_LIMITS.fileBytes, INSTRUCTION_LIMITS.totalBytes - total);
    if (room <= 0) return;
    const text = bytes
      .subarray(0, room)
      .toString("utf8")
      .replace(/\uFFFD+$/, "");
    total += Buffer.byteLength(text);
    files.push({ path, text });
  };
  await take(join(root, INSTRUCTION_FILE));
  const rules = await readdir(join(root, RULES_DIR)).catch(() => [] as string[]);
  for (const name of rules
    .filter((n) => n.endsWith(".md"))
    .sort()
    .slice(0, INSTRUCTION_LIMITS.rules))
    await take(join(root, RULES_DIR, name));
  for (const d of chain.slice(1)) await take(join(d, INSTRUCTION_FILE));
  return files;
}

/** How instruction files appear in a composed prompt: paths relative to the root, text as data. */
export function instructionSection(root: string, files: readonly InstructionFile[]): string | undefined {
  if (files.length === 0) return undefined;
  const blocks = files.map((f) => {
    const name = relative(root, f.path) || f.path;
    const safe = f.text.replace(/<\/?project-instructions\b/gi, (m) => m.replace("<", "&lt;"));
    return `<project-instructions file="${name.replace(/"/g, "&quot;")}">\n${safe}\n</project-instructions>`;
  });
  return `# Project instructions\n${blocks.join("\n")}`;
}
