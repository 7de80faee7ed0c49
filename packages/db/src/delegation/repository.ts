import type pg from "pg";
import type { DelegationRepository } from "../repositories/delegation.js";
import * as accounts from "./accounts.js";
import * as delivery from "./delivery.js";
import * as forks from "./forks.js";
import * as journal from "./journal.js";
import * as recovery from "./recovery.js";
import * as runs from "./runs.js";
import * as sessions from "./sessions.js";
import * as steers from "./steers.js";

/** DelegationRepository over PostgreSQL. It owns no state beyond the pool it is given. */
export class PgDelegationRepository implements DelegationRepository {
  constructor(readonly pool: pg.Pool) {}

  createAccount: DelegationRepository["createAccount"] = (i) => accounts.createAccount(this.pool, i);
  getAccount: DelegationRepository["getAccount"] = (id) => accounts.getAccount(this.pool, id);
  addApiToken: DelegationRepository["addApiToken"] = (id, h, l) => accounts.addApiToken(this.pool, id, h, l);
  accountByTokenHash: DelegationRepository["accountByTokenHash"] = (h) =>
    accounts.accountByTokenHash(this.pool, h);

  createRootSession: DelegationRepository["createRootSession"] = (p, m) =>
    sessions.createRootSession(this.pool, p, m);
  getSession: DelegationRepository["getSession"] = (s, p) => sessions.getSession(this.pool, s, p);
  getChildSession: DelegationRepository["getChildSession"] = (a, c, p) =>
    sessions.getChildSession(this.pool, a, c, p);
  ancestry: DelegationRepository["ancestry"] = (s, p) => sessions.ancestry(this.pool, s, p);

  append: DelegationRepository["append"] = (s, p, e, o) => journal.append(this.pool, s, p, e, o);
  readJournal: DelegationRepository["readJournal"] = (s, p, o) => journal.readJournal(this.pool, s, p, o);
  recentAssistantMessages: DelegationRepository["recentAssistantMessages"] = (s, p, l, b) =>
    journal.recentAssistantMessages(this.pool, s, p, l, b);
  settleProvisional: DelegationRepository["settleProvisional"] = (s, p, a) =>
    journal.settleProvisional(this.pool, s, p, a);

  createDelegation: DelegationRepository["createDelegation"] = (i) => runs.createDelegation(this.pool, i);
  createContinuation: DelegationRepository["createContinuation"] = (i) =>
    runs.createContinuation(this.pool, i);
  getRun: DelegationRepository["getRun"] = (r, p) => runs.getRun(this.pool, r, p);
  runForToolCall: DelegationRepository["runForToolCall"] = (s, t, p) =>
    runs.runForToolCall(this.pool, s, t, p);
  openRunForChild: DelegationRepository["openRunForChild"] = (c, p) => runs.openRunForChild(this.pool, c, p);
  markRunStarted: DelegationRepository["markRunStarted"] = (r, g, o) =>
    runs.markRunStarted(this.pool, r, g, o);
  markRunSettling: DelegationRepository["markRunSettling"] = (r, g) => runs.markRunSettling(this.pool, r, g);
  startRun: DelegationRepository["startRun"] = (r, g, o) => runs.startRun(this.pool, r, g, o);
  settleRun: DelegationRepository["settleRun"] = (r, o) => runs.settleRun(this.pool, r, o);
  openChildRuns: DelegationRepository["openChildRuns"] = (s, p) => runs.openChildRuns(this.pool, s, p);

  settledResultIds: DelegationRepository["settledResultIds"] = (s, p) =>
    journal.settledResultIds(this.pool, s, p);
  queuedResultIds: DelegationRepository["queuedResultIds"] = (s, p) =>
    delivery.queuedResultIds(this.pool, s, p);
  queuedResults: DelegationRepository["queuedResults"] = (s, p, l) =>
    delivery.queuedResults(this.pool, s, p, l);
  getResult: DelegationRepository["getResult"] = (r, p) => delivery.getResult(this.pool, r, p);
  deliverResults: DelegationRepository["deliverResults"] = (s, p, ids, m, o) =>
    delivery.deliverResults(this.pool, s, p, ids, m, o);

  enqueueSteer: DelegationRepository["enqueueSteer"] = (c, p, t) => steers.enqueueSteer(this.pool, c, p, t);
  pendingSteers: DelegationRepository["pendingSteers"] = (c, p) => steers.pendingSteers(this.pool, c, p);
  deliverSteers: DelegationRepository["deliverSteers"] = (c, p, ids) =>
    steers.deliverSteers(this.pool, c, p, ids);
  dropSteers: DelegationRepository["dropSteers"] = (c, p, r) => steers.dropSteers(this.pool, c, p, r);

  recordSpill: DelegationRepository["recordSpill"] = (r) => recovery.recordSpill(this.pool, r);

  discardPrivateSessions: DelegationRepository["discardPrivateSessions"] = () =>
    recovery.discardPrivateSessions(this.pool);
  claimOpenRuns: DelegationRepository["claimOpenRuns"] = (o, l) => recovery.claimOpenRuns(this.pool, o, l);
  holdOwnerLease: DelegationRepository["holdOwnerLease"] = (o) => recovery.holdOwnerLease(this.pool, o);
  releaseRun: DelegationRepository["releaseRun"] = (r, o) => recovery.releaseRun(this.pool, r, o);
  chargeRecoveryAttempt: DelegationRepository["chargeRecoveryAttempt"] = (r, g) =>
    recovery.chargeRecoveryAttempt(this.pool, r, g);
  sessionsWithDanglingToolCalls: DelegationRepository["sessionsWithDanglingToolCalls"] = () =>
    recovery.sessionsWithDanglingToolCalls(this.pool);
  sessionsWithQueuedResults: DelegationRepository["sessionsWithQueuedResults"] = () =>
    recovery.sessionsWithQueuedResults(this.pool);
  copyJournalBranch: DelegationRepository["copyJournalBranch"] = (s, t, p, u) =>
    forks.copyJournalBranch(this.pool, s, t, p, u);
  commitFork: DelegationRepository["commitFork"] = (s, p) => forks.commitFork(this.pool, s, p);
}
