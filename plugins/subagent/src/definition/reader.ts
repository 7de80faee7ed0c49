import { createHash } from "node:crypto";
import { constants } from "node:fs";
import { open, realpath } from "node:fs/promises";
import { extname, isAbsolute, relative, resolve, sep } from "node:path";
import { WorkflowDefinitionError } from "../errors.js";
import { DEFINITION_LIMITS } from "./schema.js";

/** One read of a project file: its content and the version (sha256 of the bytes) that read saw. */
export interface ProjectFile {
  readonly path: string;
  readonly text: string;
  readonly byteSize: number;
  /** sha256 hex of exactly the bytes returned. */
  readonly version: string;
}

/**
 * The one seam through which WorkflowStart reads a definition (the host's `readManagedProjectFile`):
 * target-authorized, bounded, version-pinned. `expectedVersion` pins a read to a version seen earlier.
 */
export interface ProjectFileReader {
  readProjectFile(path: string, options?: { expectedVersion?: string }): Promise<ProjectFile>;
}

export interface BoundedProjectFileReaderOptions {
  /** The selected project root: a file outside it (symbolic links resolved) is refused. */
  readonly root: string;
  /** Relative paths resolve against this directory (the turn's cwd); defaults to `root`. */
  readonly cwd?: string;
  readonly maxBytes?: number;
}

function refuse(
  code: "definition_unreadable" | "definition_too_large" | "definition_changed",
  message: string,
  context: Record<string, unknown>,
  cause?: unknown,
): never {
  throw new WorkflowDefinitionError(code, message, context, cause === undefined ? undefined : { cause });
}

/**
 * The caller's path resolved inside the project, or one refusal. Containment is decided on the path as
 * given (resolved against the cwd, `..` normalized) before any file-system call on it, so a path outside
 * learns nothing about the host; symbolic links are then resolved, and one leading out gets the same refusal.
 * Messages name the path only as the caller gave it.
 */
async function resolveInsideProject(options: BoundedProjectFileReaderOptions, path: string): Promise<string> {
  const outside = (): never =>
    refuse("definition_unreadable", `workflow definition ${path} is not a file of this project`, { path });
  const root = resolve(options.root);
  const rootReal = await realpath(root).catch(() => root);
  const target = resolve(options.cwd ?? root, path);
  if (!within(root, target) && !within(rootReal, target)) outside();
  let real: string;
  try {
    real = await realpath(target);
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    return refuse(
      "definition_unreadable",
      `cannot read workflow definition ${path}${typeof code === "string" ? ` (${code})` : ""}`,
      { path },
    );
  }
  if (!within(rootReal, real)) outside();
  return real;
}

function within(root: string, target: string): boolean {
  const rel = relative(root, target);
  return !(rel === ".." || rel.startsWith(`..${sep}`) || isAbsolute(rel));
}

/**
 * A host project reader: resolves the path inside the root, opens the file once, refuses it when larger than
 * the bound (checked on the open descriptor, and again while reading), and refuses a file that changed while
 * it was read (size or modification time moved): the returned text is exactly the version named.
 */
export function boundedProjectFileReader(options: BoundedProjectFileReaderOptions): ProjectFileReader {
  const maxBytes = options.maxBytes ?? DEFINITION_LIMITS.bytes;
  return {
    async readProjectFile(path, readOptions = {}) {
      if (path.length === 0 || path.length > 4096 || path.includes("\0")) {
        refuse("definition_unreadable", "definition path is empty, too long or malformed", {
          path: path.slice(0, 200),
        });
      }
      const real = await resolveInsideProject(options, path);
      const handle = await open(real, constants.O_RDONLY | constants.O_NOFOLLOW).catch(() =>
        refuse("definition_unreadable", `cannot open workflow definition ${path}`, { path }),
      );
      try {
        const before = await handle.stat();
        if (!before.isFile()) refuse("definition_unreadable", `${path} is not a regular file`, { path });
        if (before.size > maxBytes) {
          refuse(
            "definition_too_large",
            `workflow definition is ${before.size} bytes; the limit is ${maxBytes}`,
            {
              path,
              bytes: before.size,
              limit: maxBytes,
            },
          );
        }
        const buffer = Buffer.alloc(maxBytes + 1);
        let length = 0;
        for (;;) {
          const { bytesRead } = await handle.read(buffer, length, buffer.length - length, length);
          if (bytesRead === 0) break;
          length += bytesRead;
          if (length > maxBytes) {
            refuse("definition_too_large", `workflow definition grew past ${maxBytes} bytes while read`, {
              path,
              limit: maxBytes,
            });
          }
        }
        const after = await handle.stat();
        if (after.size !== length || after.mtimeMs !== before.mtimeMs || after.size !== before.size) {
          refuse("definition_changed", `workflow definition ${path} changed while it was read; try again`, {
            path,
          });
        }
        const bytes = buffer.subarray(0, length);
        const version = createHash("sha256").update(bytes).digest("hex");
        if (readOptions.expectedVersion !== undefined && readOptions.expectedVersion !== version) {
          refuse("definition_changed", `workflow definition ${path} is not the pinned version`, {
            path,
            expected: readOptions.expectedVersion,
            actual: version,
          });
        }
        let text: string;
        try {
          text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
        } catch (e) {
          refuse("definition_unreadable", `workflow definition ${path} is not UTF-8 text`, { path }, e);
        }
        return { path: real, text, byteSize: length, version };
      } finally {
        await handle.close();
      }
    },
  };
}

/**
 * A session's reader: the project it reads is looked up at each read (`where`: its root and the directory
 * relative paths start from), so a session reads its own project's files and never the host's directory of
 * its own. A session with no directory on this host reads nothing.
 */
export function sessionProjectFileReader(
  where: () => Promise<{ readonly root: string; readonly cwd: string } | null>,
): ProjectFileReader {
  return {
    async readProjectFile(path, readOptions) {
      const project = await where();
      if (!project) {
        refuse(
          "definition_unreadable",
          `cannot read workflow definition ${path}: this session has no project directory to read it from`,
          { path: path.slice(0, 200) },
        );
      }
      return boundedProjectFileReader(project).readProjectFile(path, readOptions);
    },
  };
}

export function definitionFormat(path: string): "yaml" | "json" {
  return extname(path).toLowerCase() === ".json" ? "json" : "yaml";
}
