/**
 * zod as crw's builds load it: one bundled file instead of zod's ~95 modules from node_modules, which cost
 * each process about twice as much CPU to resolve, read and compile. Every package's build imports zod
 * through here (`@crw/db/zod`), so a process holds one copy whichever packages it loads; sources and tests
 * import `zod` itself, which this re-exports unchanged.
 */
export * from "zod";
