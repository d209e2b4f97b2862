"""Scale-out runs of the chaos suite (issue 14): a Kafka cluster (`--kafka-brokers 3`) and several
`stocksvr all` instances sharing one stack (`--instances 3`), with their two fault kinds:

  kill-kafka-leader  kill -9 the broker that leads the busiest partitions (most records in the
                     partitions it leads, over every stocksvr topic); it stays down 18-25 s while
                     the processors must keep going on the other two brokers (outbox rows sent and
                     consumer offsets committed are counted while it is down), then
                     `scripts/stack up kafka-N` restarts it and the fault waits until no partition
                     is under-replicated (the broker caught up and rejoined every ISR).
  kill-instance      kill -9 the `stocksvr all` instance that leads the outbox relay (a drawn one
                     when none leads) and keep it down until the work has moved to the others: no
                     member of any consumer group is from the dead instance and every partition of
                     the group's topics is assigned again, the relay is led by another instance,
                     no unfinished WAL row and no reconciler shard is leased by the dead process
                     (its lease expired and another instance took it over, or finished it), and no
                     reservation the dead instance left in an intermediate status is left there
                     (recovery resumed it). Each of these is timed from the kill; the partitions
                     and the relay's lead must be taken over within TAKEOVER_BOUND_S (issue 51:
                     10 s; 48 s before the consumers' session timeout went from 45 s to 6 s).
                     Then it is started again.

and the upgrade kinds (issue 51), for a run whose instances start on the previous release
(`scripts/chaos --upgrade-from REV`):

  roll-upgrade        the operator's steps of a release with the new binary while the previous
                     one serves (`stocksvr migrate`, `topics apply`, `schemas register`), then
                     each instance in turn: SIGTERM (it drains and commits), start it with the new
                     binary, wait until /readyz answers 200 and 5 s more; the next one only
                     then; at the end, until every consumer group is stable with every instance
                     a member and every partition assigned. Mixed versions share the consumer
                     groups, the relay's lease and the tables meanwhile.
  roll-upgrade-kill9  the same, but the middle instance is killed with kill -9 instead of
                     stopped: a crash in the middle of the roll.

Each records what it saw (`cluster_fault` records in the history) and the run turns a failure to
catch up / rebalance / make progress into an anomaly (`kafka_catch_up`, `kafka_progress`,
`rebalance`).
"""

import os
import signal
import time

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

import state as state_mod
import system as system_mod
from stocksvr_harness import codes
from stocksvr_harness.wait import WaitTimeout, wait_until

KINDS = ["kill-kafka-leader", "kill-instance", "roll-upgrade", "roll-upgrade-kill9"]
UPGRADE_KINDS = ("roll-upgrade", "roll-upgrade-kill9")
# An upgraded instance must be ready (/readyz 200: Kafka, the registry, MySQL, Redis) within this.
READY_BOUND_S = 90.0
# After an upgraded instance is ready, the roll waits this long before the next one (as a
# Kubernetes rollout's minReadySeconds would): mixed versions serve side by side under load.
ROLL_SETTLE_S = 5.0

# After kill -9 of an instance, its partitions and the relay's lead are taken over within this
# (the consumers' 6 s session plus a 2 s heartbeat; the relay's 6 s lease plus its 2 s idle
# poll). The other leases (WAL, reconciler shards, recovery) are timed and reported.
TAKEOVER_BOUND_S = 10.0
# What kill-instance waits for, in the order the summary lists their takeover times.
TAKEOVER_ITEMS = ("partitions", "relay_lead", "wal_leases", "reconcile_shards", "in_flight_reservations")

# Every topic of a run (no namespace in the chaos suite).
TOPICS = ["order.lifecycle.v1", "inventory.schedule.v1", "inventory.stock-change.v1", "inventory.lifecycle.v1",
          "order.lifecycle.v1.dlt", "inventory.schedule.v1.dlt", "inventory.stock-change.v1.dlt"]


def configure(instances, kafka_brokers):
    """Turn the module-level role and server lists into those of a scale-out run (in place: the
    other modules imported the very objects)."""
    if instances:
        system_mod.ROLES.clear()
        for i in range(1, instances + 1):
            system_mod.ROLES[f"all-{i}"] = ("all", 45 + i)
        system_mod.API_ROLES[:] = list(system_mod.ROLES)
    if kafka_brokers > 1:
        system_mod.SERVERS[:] = [s for s in system_mod.SERVERS if s != "kafka"]
        system_mod.SERVERS.extend(["kafka"] + [f"kafka-{i}" for i in range(2, kafka_brokers + 1)])


def retried(state, fn, deadline_s=60.0):
    """fn() again (with new clients) while Kafka answers a retriable error, e.g. a group
    coordinator still loading on the broker that took over from the killed one."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except KafkaException:
            if time.monotonic() > end:
                raise
            state.reset_kafka_clients()
            time.sleep(1.0)


def broker_server(node_id):
    return "kafka" if node_id == 1 else f"kafka-{node_id}"


class KafkaView:
    """Leaders, replicas and consumer groups as the cluster reports them."""

    def __init__(self, bootstrap, state):
        self.bootstrap = bootstrap
        self.state = state

    @property
    def admin(self):
        # a new client per request (see State.fresh_kafka_clients)
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def metadata(self):
        return self.admin.list_topics(timeout=10)

    def under_replicated(self):
        """[(topic, partition, replicas, isr)] of every partition whose ISR is short."""
        out = []
        for name, t in self.metadata().topics.items():
            for p, pm in t.partitions.items():
                if len(pm.isrs) < len(pm.replicas):
                    out.append((name, p, list(pm.replicas), list(pm.isrs)))
        return out

    def busiest_leader(self):
        """(node id, {node: records in the partitions it leads}) over the stocksvr topics."""
        md = self.metadata()
        self.state.reset_kafka_clients()
        load = {}
        for topic in TOPICS:
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                continue
            for p, pm in t.partitions.items():
                low, high = self.state.consumer().get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                load[pm.leader] = load.get(pm.leader, 0) + (high - low)
        if not load:
            raise RuntimeError("no partition leaders found")
        return max(load, key=lambda n: (load[n], -n)), load

    def groups(self):
        """group -> {"members": [client ids], "assigned": set((topic, partition))}"""
        out = {}
        groups = list(state_mod.GROUP_TOPICS)
        admin = self.admin  # kept until the futures resolve (a destroyed client never resolves them)
        futs = admin.describe_consumer_groups(groups, request_timeout=15)
        for g, fut in futs.items():
            d = fut.result(timeout=20)
            assigned = set()
            members = []
            for m in d.members:
                members.append(m.client_id)
                if m.assignment:
                    for tp in m.assignment.topic_partitions:
                        assigned.add((tp.topic, tp.partition))
            out[g] = {"members": members, "assigned": assigned, "state": str(d.state)}
        return out

    def unassigned(self, groups):
        """group -> partitions of its topics that no member holds."""
        md = self.metadata()
        out = {}
        for g, topics in state_mod.GROUP_TOPICS.items():
            want = set()
            for topic in topics:
                t = md.topics.get(topic)
                if t is not None and t.error is None:
                    want |= {(topic, p) for p in t.partitions}
            missing = want - groups.get(g, {}).get("assigned", set())
            if missing:
                out[g] = sorted(f"{t}:{p}" for t, p in missing)
        return out


def progress_counters(state):
    """(outbox rows sent, sum of committed offsets of every group): both must grow while a
    broker is down if the processors keep going."""
    state.reset_kafka_clients()
    sent = state.query("SELECT COUNT(*) n FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1 "
                       f"WHERE {state_mod.OUTBOX_SENT_WHERE}")[0]["n"]
    committed = 0
    for g in state_mod.GROUP_TOPICS:
        committed += sum(max(0, o) for o in state.committed(g).values())
    return sent, committed


def kill_kafka_leader(faults, fid, kind):
    s, run = faults.system, faults.run_ref
    view = KafkaView(s.kafka_direct, run.state)
    node, load = retried(run.state, view.busiest_leader)
    server = broker_server(node)
    pid = s.server_pid(server)
    if pid is None:
        raise RuntimeError(f"{server} is not running")
    # Longer than the controller's broker.session.timeout.ms (9 s) plus a margin: only then is
    # the broker fenced, its partitions' ISRs shrunk and their leadership (and the group
    # coordinators it held) moved, so the processors must have worked on the other two.
    down_for = round(faults.rng.uniform(18.0, 25.0), 1)
    before = retried(run.state, lambda: progress_counters(run.state))
    faults.start_record(fid, kind, server, pid=pid, node=node, records_led=load, down_for=down_for)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    try:
        faults.hold(down_for)
        during = retried(run.state, lambda: progress_counters(run.state))
        urp_down = len(retried(run.state, view.under_replicated))
    finally:
        t0 = time.monotonic()
        s.stack_up(server)  # the broker comes back whatever the probes did
    restarted = time.monotonic() - t0
    # Catch-up: every partition back to its full ISR (the restarted broker fetched what it missed).
    seen = {"urp": []}

    def caught_up():
        seen["urp"] = retried(run.state, view.under_replicated)
        return not seen["urp"]

    try:
        wait_until(caught_up, 180, "every partition back to its full ISR")
    except WaitTimeout:
        pass  # an anomaly below, with the partitions left
    urp = seen["urp"]
    catch_up = time.monotonic() - t0
    rec = dict(fault=fid, what="kill-kafka-leader", node=node, server=server, pid=pid, records_led=load,
               down_s=round(t0 - t_kill, 1), under_replicated_while_down=urp_down, restart_s=round(restarted, 1),
               catch_up_s=round(catch_up, 1),
               under_replicated_left=len(urp), outbox_sent_while_down=during[0] - before[0],
               offsets_committed_while_down=during[1] - before[1])
    s.history.record("cluster_fault", **rec)
    run.cluster_results.append(rec)
    if urp_down == 0:
        run.anomaly("kafka_catch_up", {"server": server}, "no partition was under-replicated with the broker down "
                    "(was it in any ISR? are the topics replicated?)")
    if urp:
        run.anomaly("kafka_catch_up", {"server": server}, f"{len(urp)} partitions still under-replicated "
                    f"{catch_up:.0f}s after the restart: {urp[:5]}")
    if during[0] - before[0] <= 0 or during[1] - before[1] <= 0:
        run.anomaly("kafka_progress", {"server": server}, f"with {server} down for {down_for}s: outbox rows sent "
                    f"+{during[0] - before[0]}, committed offsets +{during[1] - before[1]} (both must grow)")
    return server, {"down_for": down_for}, (f"killed node {node} (pid {pid}, led {load}); restarted in "
                                            f"{restarted:.1f}s; under-replicated partitions 0 after "
                                            f"{catch_up:.1f}s" if not urp else f"{len(urp)} URP left")


def relay_leader(s, run, live):
    """The live role whose process holds the outbox relay's lease (owner <host>-<pid>-...), or None."""
    rows = run.state.query("SELECT owner FROM inventory_outbox_relay WHERE id = 1 AND lease_until > NOW(3)")
    owner = rows[0]["owner"] if rows else None
    for role in live:
        p = s.procs.get(role)
        if owner and p is not None and f"-{p.pid}-" in owner:
            return role
    return None


def kill_instance(faults, fid, kind):
    s, run = faults.system, faults.run_ref
    view = KafkaView(s.kafka_direct, run.state)
    live = [r for r in system_mod.ROLES if s.role_alive(r)]
    if len(live) < 2:
        raise RuntimeError(f"only {live} running")
    # The relay's leader, so that every run times the takeover of its lease too.
    leader = relay_leader(s, run, live)
    role = leader or faults.rng.choice(live)
    prefix = f"chaos-{role}-"
    groups_before = retried(run.state, view.groups)
    faults.start_record(fid, kind, role, members_before={g: v["members"] for g, v in groups_before.items()},
                        relay_leader=leader is not None)
    killed_at = run.state.query("SELECT UTC_TIMESTAMP(3) t")[0]["t"]
    pid = s.kill_role(role)
    t0 = time.monotonic()
    seen = {"pending": {}}
    cleared = {}  # item -> seconds from the kill to the first poll that found it taken over

    def taken_over():
        if faults.stop_event.is_set():
            return True  # the run is ending: what is still pending is left unjudged below
        pending = {}
        try:
            groups = view.groups()
            stale = {g: [m for m in v["members"] if m.startswith(prefix)] for g, v in groups.items()}
            stale = {g: m for g, m in stale.items() if m}
            if stale:
                pending["members_of_dead_instance"] = stale
            missing = view.unassigned(groups)
            if missing:
                pending["unassigned"] = missing
        except Exception as e:  # a group mid-rebalance may fail to describe: try again
            pending["describe_error"] = f"{type(e).__name__}: {e}"
        wal = run.state.query("SELECT COUNT(*) n FROM inventory_operation_wal WHERE status IN "
                              f"{codes.sql_list(codes.WAL_UNFINISHED)} "
                              "AND lease_owner LIKE %s", (f"%:{pid}:%",))[0]["n"]
        if wal:
            pending["wal_leased_by_dead"] = wal
        # The outbox relay's lead (lease name <host>-<pid>-...): another instance takes it over
        # once the dead one's lease runs out (relay.claim_lease_secs).
        led = run.state.query("SELECT COUNT(*) n FROM inventory_outbox_relay WHERE owner LIKE %s",
                              (f"%-{pid}-%",))[0]["n"]
        if led:
            pending["relay_led_by_dead"] = led
        # Reconciler shards (lease owner <host>:<pid>): free once the lease runs out, taken by
        # another instance's next claim (the shard was due when the dead one claimed it).
        shards = run.state.query("SELECT COUNT(*) n FROM inventory_reconcile_shard WHERE lease_owner LIKE %s",
                                 (f"%:{pid}",))[0]["n"]
        if shards:
            pending["reconcile_shards_of_dead"] = shards
        # Steps the dead instance left half done (its Trys in flight, rows its recovery worker
        # had claimed): the recovery worker resumes them once they fall due.
        orphans = run.state.query("SELECT COUNT(*) n FROM inventory_reservation WHERE status IN "
                                  f"{codes.sql_list(codes.INTERMEDIATE)} AND dead = 0 AND updated_at < %s",
                                  (killed_at,))[0]["n"]
        if orphans:
            pending["in_flight_reservations_left"] = orphans
        at = round(time.monotonic() - t0, 1)
        for item, keys in (("partitions", ("members_of_dead_instance", "unassigned", "describe_error")),
                           ("relay_lead", ("relay_led_by_dead",)), ("wal_leases", ("wal_leased_by_dead",)),
                           ("reconcile_shards", ("reconcile_shards_of_dead",)),
                           ("in_flight_reservations", ("in_flight_reservations_left",))):
            if item not in cleared and not any(k in pending for k in keys):
                cleared[item] = at
        seen["pending"] = pending
        return not pending

    try:
        wait_until(taken_over, 150, f"the work of {role} (pid {pid}) to move to the other instances", interval=0.5)
    except WaitTimeout:
        pass  # an anomaly below, with what was still pending
    pending = seen["pending"]
    secs = time.monotonic() - t0
    takeover = {item: cleared.get(item) for item in TAKEOVER_ITEMS}
    groups_after = retried(run.state, view.groups) if not pending else {}
    shards = run.state.query("SELECT lease_owner, COUNT(*) n FROM inventory_reconcile_shard GROUP BY lease_owner")
    rec = dict(fault=fid, what="kill-instance", role=role, pid=pid, rebalanced=not pending,
               rebalance_s=round(secs, 1), takeover_s=takeover, relay_leader=leader is not None,
               pending=pending,
               members_after={g: v["members"] for g, v in groups_after.items()},
               reconcile_shard_owners={str(r["lease_owner"]): r["n"] for r in shards})
    s.history.record("cluster_fault", **{k: (sorted(v) if isinstance(v, set) else v) for k, v in rec.items()})
    run.cluster_results.append(rec)
    if pending and not faults.stop_event.is_set():
        run.anomaly("rebalance", {"role": role, "pid": pid},
                    f"work not taken over {secs:.0f}s after kill -9: {pending}")
    # The bound holds for what was there to take over: the relay's lead only when the dead
    # instance held it.
    bounded = ["partitions"] + (["relay_lead"] if leader else [])
    late = {item: takeover[item] for item in bounded
            if takeover[item] is None or takeover[item] > TAKEOVER_BOUND_S}
    if late and not faults.stop_event.is_set():
        run.anomaly("takeover_bound", {"role": role, "pid": pid},
                    f"taken over later than {TAKEOVER_BOUND_S:.0f}s after kill -9 (seconds; None: not at all): "
                    f"{late}; every item: {takeover}")
    s.start_role(role)
    return role, {}, f"killed pid {pid}; taken over in {takeover} s; all in {secs:.1f}s; restarted"


def roll_upgrade(faults, fid, kind):
    s, run = faults.system, faults.run_ref
    order = [r for r in system_mod.ROLES if r in s.on_previous]
    if not order:
        raise RuntimeError("no instance runs the previous release (scripts/chaos --upgrade-from REV)")
    crash = kind == "roll-upgrade-kill9"
    crashed = order[len(order) // 2] if crash else None
    faults.start_record(fid, kind, ",".join(order), crashed=crashed)
    t0 = time.monotonic()
    failed = run.release_steps(previous=False)
    for step, detail in failed:
        run.anomaly("upgrade", {"step": step}, detail)
    steps_s = round(time.monotonic() - t0, 1)
    rolled = []
    for role in order:
        t = time.monotonic()
        if role == crashed:
            s.kill_role(role)
            how = "kill -9"
        else:
            code = s.stop_role(role)
            how = f"SIGTERM (exit {code})"
        stopped = time.monotonic()
        s.on_previous.discard(role)
        s.start_role(role)
        ready = s.wait_ready(role, READY_BOUND_S)
        rolled.append({"role": role, "how": how, "stop_s": round(stopped - t, 1),
                       "ready_s": round(time.monotonic() - stopped, 1) if ready else None})
        if not ready:
            run.anomaly("upgrade", {"role": role}, f"the new release of {role} was not ready within "
                        f"{READY_BOUND_S:.0f}s: {s.exit_reason(role) or 'no error logged'}")
            break
        if role != order[-1]:
            faults.hold(ROLL_SETTLE_S)
    # A roll is over when the groups are: every instance a member of every group and every
    # partition assigned (the last restart's rebalance done), as before the next fault.
    t_settle = time.monotonic()
    view = KafkaView(s.kafka_direct, run.state)
    seen = {"pending": None}

    def settled():
        if faults.stop_event.is_set():
            return True
        try:
            groups = view.groups()
        except Exception as e:  # a group mid-rebalance may fail to describe: try again
            seen["pending"] = f"{type(e).__name__}: {e}"
            return False
        absent = {g: [r for r in order if not any(m.startswith(f"chaos-{r}-") for m in v["members"])]
                  for g, v in groups.items()}
        absent = {g: rs for g, rs in absent.items() if rs}
        missing = view.unassigned(groups)
        # Mid-rebalance a group still lists the old assignment: only a stable one counts.
        unstable = {g: v["state"] for g, v in groups.items() if "STABLE" not in v["state"].upper()}
        pending = {"not_members": absent, "unassigned": missing, "not_stable": unstable}
        seen["pending"] = pending if any(pending.values()) else None
        return seen["pending"] is None

    try:
        wait_until(settled, READY_BOUND_S, "every group to hold every upgraded instance", interval=0.5)
    except WaitTimeout:
        run.anomaly("upgrade", {"roles": order}, f"the groups had not settled {READY_BOUND_S:.0f}s after the "
                    f"roll: {seen['pending']}")
    rec = dict(fault=fid, what=kind, release_steps_s=steps_s, rolled=rolled,
               groups_settled_s=round(time.monotonic() - t_settle, 1),
               total_s=round(time.monotonic() - t0, 1), still_previous=sorted(s.on_previous))
    s.history.record("cluster_fault", **rec)
    run.cluster_results.append(rec)
    return ",".join(order), {"crashed": crashed}, (
        f"migrate/topics/schemas in {steps_s}s, then " + "; ".join(
            f"{r['role']}: {r['how']} in {r['stop_s']}s, new release ready in {r['ready_s']}s" for r in rolled))


def run_fault(faults, kind, fid):
    if kind in UPGRADE_KINDS:
        return roll_upgrade(faults, fid, kind)
    if kind == "kill-kafka-leader":
        return kill_kafka_leader(faults, fid, kind)
    if kind == "kill-instance":
        return kill_instance(faults, fid, kind)
    raise ValueError(kind)
