import type pg from "pg";
import type { DelegationRepository } from "../repositories/delegation.js";
import * as accounts from "./accounts.js";
import * as clientSessions from "./clientSessions.js";
import * as delivery from "./delivery.js";
import * as forks from "./forks.js";
import * as journal from "./journal.js";
import * as projects from "./projects.js";
import * as recovery from "./recovery.js";
import * as runs from "./runs.js";
import * as sessions from "./sessions.js";
import * as steers from "./steers.js";
import * as tokens from "./tokens.js";
import * as worktrees from "./worktrees.js";

/** DelegationRepository over PostgreSQL. It owns no state beyond the pool it is given. */
export class PgDelegationRepository implements DelegationRepository {
  constructor(
    readonly pool: pg.Pool,
    private readonly hooks: { onLeaseLost?: (owner: string, e: unknown) => void } = {},
  ) {}

  createAccount: DelegationRepository["createAccount"] = async (i) => accounts.createAccount(this.pool, i);
  getAccount: DelegationRepository["getAccount"] = async (id) => accounts.getAccount(this.pool, id);
  accountByName: DelegationRepository["accountByName"] = async (n) => accounts.accountByName(this.pool, n);
  addApiToken: DelegationRepository["addApiToken"] = async (id, h, l) =>
    accounts.addApiToken(this.pool, id, h, l);
  accountByTokenHash: DelegationRepository["accountByTokenHash"] = async (h) =>
    accounts.accountByTokenHash(this.pool, h);
  listAccounts: DelegationRepository["listAccounts"] = async () => accounts.listAccounts(this.pool);
  setAccountGrants: DelegationRepository["setAccountGrants"] = async (id, g) =>
    accounts.setAccountGrants(this.pool, id, g);
  ensureOwnerAccount: DelegationRepository["ensureOwnerAccount"] = async () =>
    accounts.ensureOwnerAccount(this.pool);
  listApiTokens: DelegationRepository["listApiTokens"] = async (id) => tokens.listApiTokens(this.pool, id);
  revokeApiToken: DelegationRepository["revokeApiToken"] = async (id) => tokens.revokeApiToken(this.pool, id);
  unusableTokenHashes: DelegationRepository["unusableTokenHashes"] = async (h) =>
    tokens.unusableTokenHashes(this.pool, h);

  addProject: DelegationRepository["addProject"] = async (r, root) => projects.addProject(this.pool, r, root);
  grantProject: DelegationRepository["grantProject"] = async (r, a) => projects.grantProject(this.pool, r, a);
  getProject: DelegationRepository["getProject"] = async (r) => projects.getProject(this.pool, r);
  listProjects: DelegationRepository["listProjects"] = async () => projects.listProjects(this.pool);
  projectForPath: DelegationRepository["projectForPath"] = async (d) => projects.projectForPath(this.pool, d);

  isolatedWorktree: DelegationRepository["isolatedWorktree"] = async (s, p) =>
    worktrees.isolatedWorktree(this.pool, s, p);
  addNodeWorktree: DelegationRepository["addNodeWorktree"] = async (s, p, w, n) =>
    worktrees.addNodeWorktree(this.pool, s, p, w, n);
  workflowWorktrees: DelegationRepository["workflowWorktrees"] = async (w, p) =>
    worktrees.workflowWorktrees(this.pool, w, p);
  recordWorktreeCommit: DelegationRepository["recordWorktreeCommit"] = async (s, p, w, c) =>
    worktrees.recordWorktreeCommit(
      this.pool,
      s,
      p,
      w === "committed" ? "committed_commit" : "landed_commit",
      c,
    );

  createRootSession: DelegationRepository["createRootSession"] = async (p, m, s) =>
    sessions.createRootSession(this.pool, p, m, s);
  getSession: DelegationRepository["getSession"] = async (s, p) => sessions.getSession(this.pool, s, p);
  getSessionWithAccount: DelegationRepository["getSessionWithAccount"] = async (s, p) =>
    sessions.getSessionWithAccount(this.pool, s, p);
  openClientSession: DelegationRepository["openClientSession"] = async (p, n, m, s) =>
    clientSessions.openClientSession(this.pool, p, n, m, s);
  takenResults: DelegationRepository["takenResults"] = async (s, p, t, l) =>
    clientSessions.takenResults(this.pool, s, p, t, l);
  childrenOf: DelegationRepository["childrenOf"] = async (s, p, l) =>
    clientSessions.childrenOf(this.pool, s, p, l);
  getChildSession: DelegationRepository["getChildSession"] = async (a, c, p) =>
    sessions.getChildSession(this.pool, a, c, p);
  ancestry: DelegationRepository["ancestry"] = async (s, p) => sessions.ancestry(this.pool, s, p);

  append: DelegationRepository["append"] = async (s, p, e, o) => journal.append(this.pool, s, p, e, o);
  appendWithSystemPrompt: DelegationRepository["appendWithSystemPrompt"] = async (s, p, e, t) =>
    journal.appendWithSystemPrompt(this.pool, s, p, e, t);
  latestTurn: DelegationRepository["latestTurn"] = async (s, p) => journal.latestTurn(this.pool, s, p);
  readJournal: DelegationRepository["readJournal"] = async (s, p, o) =>
    journal.readJournal(this.pool, s, p, o);
  readJournalTail: DelegationRepository["readJournalTail"] = async (s, p) =>
    journal.readJournalTail(this.pool, s, p);
  journalTailWithWork: NonNullable<DelegationRepository["journalTailWithWork"]> = async (s, p) =>
    journal.journalTailWithWork(this.pool, s, p);
  journalTailsWithWork: DelegationRepository["journalTailsWithWork"] = async (s) =>
    journal.journalTailsWithWork(this.pool, s);
  readJournalAfter: DelegationRepository["readJournalAfter"] = async (s, p, a) =>
    journal.readJournalAfter(this.pool, s, p, a);
  forkPoint: DelegationRepository["forkPoint"] = async (s, p, t) => journal.forkPoint(this.pool, s, p, t);
  recentAssistantMessages: DelegationRepository["recentAssistantMessages"] = async (s, p, l, b) =>
    journal.recentAssistantMessages(this.pool, s, p, l, b);
  settleProvisional: DelegationRepository["settleProvisional"] = async (s, p, a) =>
    journal.settleProvisional(this.pool, s, p, a);

  createDelegation: DelegationRepository["createDelegation"] = async (i) =>
    runs.createDelegation(this.pool, i);
  createContinuation: DelegationRepository["createContinuation"] = async (i) =>
    runs.createContinuation(this.pool, i);
  getRun: DelegationRepository["getRun"] = async (r, p) => runs.getRun(this.pool, r, p);
  runForToolCall: DelegationRepository["runForToolCall"] = async (s, t, p) =>
    runs.runForToolCall(this.pool, s, t, p);
  openRunForChild: DelegationRepository["openRunForChild"] = async (c, p) =>
    runs.openRunForChild(this.pool, c, p);
  markRunStarted: DelegationRepository["markRunStarted"] = async (r, g, o) =>
    runs.markRunStarted(this.pool, r, g, o);
  markRunSettling: DelegationRepository["markRunSettling"] = async (r, g) =>
    runs.markRunSettling(this.pool, r, g);
  markSettlingWithReply: DelegationRepository["markSettlingWithReply"] = async (r, g, c, p, o) =>
    journal.markSettlingWithReply(this.pool, r, g, c, p, o);
  startRun: DelegationRepository["startRun"] = async (r, g, o, c, w) =>
    runs.startRun(this.pool, r, g, o, c, w);
  settleRun: DelegationRepository["settleRun"] = async (r, o) => runs.settleRun(this.pool, r, o);
  recordRunProgress: DelegationRepository["recordRunProgress"] = async (r, p, g, s, j) =>
    runs.recordRunProgress(this.pool, r, p, g, s, j);
  moveRunToBackground: DelegationRepository["moveRunToBackground"] = async (r, p, g) =>
    runs.moveRunToBackground(this.pool, r, p, g);
  enqueueWorkflowSummary: DelegationRepository["enqueueWorkflowSummary"] = async (i) =>
    delivery.enqueueWorkflowSummary(this.pool, i);
  openChildRuns: DelegationRepository["openChildRuns"] = async (s, p) => runs.openChildRuns(this.pool, s, p);
  settlementWork: NonNullable<DelegationRepository["settlementWork"]> = async (s, p) =>
    runs.settlementWork(this.pool, s, p);

  settledResultIds: DelegationRepository["settledResultIds"] = async (s, p) =>
    journal.settledResultIds(this.pool, s, p);
  queuedResultIds: DelegationRepository["queuedResultIds"] = async (s, p) =>
    delivery.queuedResultIds(this.pool, s, p);
  queuedResults: DelegationRepository["queuedResults"] = async (s, p, l) =>
    delivery.queuedResults(this.pool, s, p, l);
  getResult: DelegationRepository["getResult"] = async (r, p) => delivery.getResult(this.pool, r, p);
  resultForRun: DelegationRepository["resultForRun"] = async (r, p) => delivery.resultForRun(this.pool, r, p);
  deliverResults: DelegationRepository["deliverResults"] = async (s, p, ids, m, o) =>
    delivery.deliverResults(this.pool, s, p, ids, m, o);
  deliverQueuedResults: DelegationRepository["deliverQueuedResults"] = async (s, p, m, o) =>
    delivery.deliverQueuedResults(this.pool, s, p, m, o);

  enqueueSteer: DelegationRepository["enqueueSteer"] = async (c, p, t) =>
    steers.enqueueSteer(this.pool, c, p, t);
  pendingSteers: DelegationRepository["pendingSteers"] = async (c, p) =>
    steers.pendingSteers(this.pool, c, p);
  deliverSteers: DelegationRepository["deliverSteers"] = async (c, p, ids) =>
    steers.deliverSteers(this.pool, c, p, ids);
  dropSteers: DelegationRepository["dropSteers"] = async (c, p, r) => steers.dropSteers(this.pool, c, p, r);

  recordSpill: DelegationRepository["recordSpill"] = async (r) => recovery.recordSpill(this.pool, r);
  spilledOutput: DelegationRepository["spilledOutput"] = async (sessionId, principalAccountId, path) =>
    recovery.spilledOutput(this.pool, sessionId, principalAccountId, path);
  hasSpillsOrOpenChildren: DelegationRepository["hasSpillsOrOpenChildren"] = async (
    sessionId,
    principalAccountId,
  ) => recovery.hasSpillsOrOpenChildren(this.pool, sessionId, principalAccountId);

  discardPrivateSessions: DelegationRepository["discardPrivateSessions"] = async (among) =>
    recovery.discardPrivateSessions(this.pool, among);
  claimOpenRuns: DelegationRepository["claimOpenRuns"] = async (o, l, opts) =>
    recovery.claimOpenRuns(this.pool, o, l, opts);
  orphanedWork: DelegationRepository["orphanedWork"] = async () => recovery.orphanedWork(this.pool);
  holdOwnerLease: DelegationRepository["holdOwnerLease"] = async (o) =>
    recovery.holdOwnerLease(this.pool, o, (e) => this.hooks.onLeaseLost?.(o, e));
  releaseRun: DelegationRepository["releaseRun"] = async (r, o) => recovery.releaseRun(this.pool, r, o);
  handBackRun: DelegationRepository["handBackRun"] = async (r, o) => recovery.handBackRun(this.pool, r, o);
  otherOwnersLive: DelegationRepository["otherOwnersLive"] = async (o) =>
    recovery.otherOwnersLive(this.pool, o);
  nextGenerations: DelegationRepository["nextGenerations"] = async (r) =>
    recovery.nextGenerations(this.pool, r);
  sessionsWithDanglingToolCalls: DelegationRepository["sessionsWithDanglingToolCalls"] = async (ids) =>
    recovery.sessionsWithDanglingToolCalls(this.pool, ids);
  sessionsWithQueuedResults: DelegationRepository["sessionsWithQueuedResults"] = async () =>
    recovery.sessionsWithQueuedResults(this.pool);
  copyJournalBranch: DelegationRepository["copyJournalBranch"] = async (s, t, p, u) =>
    forks.copyJournalBranch(this.pool, s, t, p, u);
  commitFork: DelegationRepository["commitFork"] = async (s, p) => forks.commitFork(this.pool, s, p);
  reclaimInheritedPrefix: DelegationRepository["reclaimInheritedPrefix"] = async (s, p, o) =>
    forks.reclaimInheritedPrefix(this.pool, s, p, o);
}
