/**
 * Worktree changes of one repository, made one at a time in this process. `git worktree add` reads the files
 * of every registered worktree while another `worktree add` may be writing its own: two parallel nodes of a
 * workflow given worktrees at once failed with "failed to read .git/worktrees/<the other>/commondir". And the
 * `worktree prune` that cleans up after a failed add removes a registration another add has not finished.
 */
const queues = new Map<string, Promise<unknown>>();

/** Runs `work` after every earlier `work` of the same `key` (a repository's git directory) has ended. */
export function oneWorktreeChangeAtATime<T>(key: string, work: () => Promise<T>): Promise<T> {
  const next = (queues.get(key) ?? Promise.resolve()).then(work, work);
  const tail = next.then(
    () => {},
    () => {},
  );
  queues.set(key, tail);
  // the map holds only repositories with work queued
  void tail.then(() => {
    if (queues.get(key) === tail) queues.delete(key);
  });
  return next;
}
