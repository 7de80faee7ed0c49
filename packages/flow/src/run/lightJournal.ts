import { readFileSync } from "node:fs";

/**
 * A reader of the journal for the owner's per-step commands (`next`, `dispatched`): JSON lines with a
 * type, no zod (its import alone would double the command's start). It reads what those commands need and
 * trusts nothing else; a torn last line is ignored like the full reader does.
 */
export interface LightRow {
  type: string;
  seq: number;
  call?: string;
  [key: string]: unknown;
}

export function readLightRows(path: string): LightRow[] {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return [];
  }
  const lines = text.split("\n");
  lines.pop(); // the part after the last newline: empty, or a torn write
  lines.shift(); // the header
  return lightRowsOf(lines);
}

/** The rows of whole journal lines (no header): a line that is not a row is skipped. */
export function lightRowsOf(lines: readonly string[]): LightRow[] {
  const rows: LightRow[] = [];
  for (const line of lines) {
    try {
      const v = JSON.parse(line) as LightRow;
      if (v && typeof v.type === "string" && typeof v.seq === "number") rows.push(v);
    } catch {
      // a corrupt line: the run process reports it; the owner's commands read around it
    }
  }
  return rows;
}
