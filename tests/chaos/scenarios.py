"""The chaos scenarios: real processes, injected faults, and the invariants checked after each.

Every scenario runs the whole fleet (five workers, one ``ctxfleet worker`` process) on the suite's
own servers — ``cluster_failover`` on a 3-node JetStream cluster of its own, with two worker
processes each given the three URLs — drives it with concurrent at-least-once runtimes, injects its
fault while the load is in flight, clears it, and then checks:

1. lost: no acknowledged valid event is missing from the ledger *and* from the stream;
2. stuck: none is missing from the ledger (but still in the stream) once the bound has passed;
3. duplicated / reordered: each thread's ledger is its publish order, every event once;
4. chain / replay: seqs are 1..n, the hash chain verifies, state equals its replay (``inspect``);
5. dead letters: every invalid input and nothing else is dead-lettered, with a code, in both the
   ``ctx.dead_letters`` table and the CTX_DEAD stream;
6. unserved: each thread's final prepare, after its last event, succeeds.

Time to recover is measured from the moment the fault is cleared (the server or worker is started
again) until every worker's ``/readyz`` answers 200 and a fresh canary event is in the ledger; for
``cluster_failover`` from the kill itself, with the killed node still down.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import assert_never

from contracts import PrepareRequest
from contracts.subjects import DEAD_STREAM, EVENTS_STREAM, PARTITIONED
from ctxfleet_client.client import FleetClient
from infra.nats_cluster import NatsCluster
from contracts.exceptions import CtxError
from tests.fixtures.audit import ThreadAudit, audit_thread
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually, reset_streams
from tests.fixtures.processes import WorkerProcess, worker_env

from .harness import Stack, Store
from .load import Poison, Runtime, connect_client, plan_events, poison_inputs

__all__ = ["SCALES", "Scale", "Scenario", "ScenarioReport", "run_scenario"]

# Small enough that an oversize event costs little to build, large enough for every valid event.
MAX_EVENT_BYTES = 64 * 1024


class Scenario(StrEnum):
    """The faults the suite injects, one scenario each."""

    FLEET_KILL = "fleet_kill"
    WORKER_KILL = "worker_kill"
    POSTGRES_RESTART = "postgres_restart"
    # SIGKILL of PostgreSQL alone, the fleet running on: the recorder's last commits, not yet flushed,
    # are lost with it and must be read again from the broker.
    POSTGRES_KILL = "postgres_kill"
    NATS_RESTART = "nats_restart"
    DUPLICATES = "duplicates"
    POISON = "poison"
    # SIGKILL of the events stream's leader node of a 3-node cluster (R3 streams) and of one of two
    # worker processes at once: the stream elects a new leader, the workers' connections move to the
    # nodes left, the killed worker is started again; the node rejoins once the fleet has recovered.
    CLUSTER_FAILOVER = "cluster_failover"


@dataclass(frozen=True)
class Scale:
    """How much load, how many faults, and how long anything may take."""

    name: str
    sessions: int
    events: int  # per session
    load_s: float  # how long the runtimes take to publish, paced, when nothing fails
    faults: int  # injections per scenario, spread over the load
    outage_s: float  # how long a stopped server stays down
    prepare_every: int
    stuck_bound_s: float  # after the load, how long a valid event may take to be recorded
    load_bound_s: float  # after which a runtime gives up on an unacknowledged event


SCALES = {
    # `make test`: six scenarios in about a minute on two shared cores.
    "small": Scale(
        "small",
        sessions=4,
        events=32,
        load_s=2.5,
        faults=1,
        outage_s=0.5,
        prepare_every=8,
        stuck_bound_s=20.0,
        load_bound_s=40.0,
    ),
    # `make chaos`: 12,000 valid events a scenario, three faults each, in a few minutes in all.
    "full": Scale(
        "full",
        sessions=40,
        events=300,
        load_s=30.0,
        faults=3,
        outage_s=3.0,
        prepare_every=10,
        stuck_bound_s=60.0,
        load_bound_s=150.0,
    ),
}


@dataclass
class ScenarioReport:
    """What one scenario published, injected and found."""

    scenario: str
    scale: str
    events: int = 0  # valid events acknowledged (runtimes and canaries)
    unacked: int = 0  # planned valid events no attempt got acknowledged within the bound
    publishes: int = 0  # every publish attempt, duplicates and retries included
    duplicates_sent: int = 0
    invalid_sent: int = 0
    faults: int = 0
    lost: int = 0
    stuck: int = 0
    duplicated: int = 0
    reordered: int = 0
    chain_failures: int = 0
    replay_failures: int = 0
    dead_letter_errors: int = 0
    unserved: int = 0
    unbounded_shutdowns: int = 0  # SIGTERM not drained within CTX_SHUTDOWN_TIMEOUT_S
    prepares: int = 0
    prepare_errors: dict[str, int] = field(default_factory=dict)
    ready_s: float | None = None  # worst fault: cleared → /readyz 200
    recover_s: float | None = None  # worst fault: cleared → a new event recorded
    elapsed_s: float = 0.0
    dead_letter_codes: dict[str, str] = field(default_factory=dict)  # invalid input → code
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> dict[str, int]:
        """The invariants that did not hold (by field name), and by how much."""
        names = (
            "unacked",
            "lost",
            "stuck",
            "duplicated",
            "reordered",
            "chain_failures",
            "replay_failures",
            "dead_letter_errors",
            "unserved",
            "unbounded_shutdowns",
        )
        return {name: count for name in names if (count := getattr(self, name))}

    @property
    def ok(self) -> bool:
        """Every invariant held."""
        return not self.failures

    @property
    def failed_prepares(self) -> int:
        """Prepares answered with an error while the load ran (expected during a fault; no invariant)."""
        return sum(self.prepare_errors.values())

    def as_json(self) -> dict[str, object]:
        """The report as ``--json`` writes it."""
        return {**asdict(self), "ok": self.ok, "failures": self.failures}


async def run_scenario(
    stack: Stack, scenario: Scenario, scale: Scale, *, seed: int, workdir: Path
) -> ScenarioReport:
    """Run one scenario on ``stack`` (fresh database and streams) and check every invariant."""
    started = time.monotonic()
    report = ScenarioReport(scenario.value, scale.name)
    database_url = await stack.new_database()
    store = Store(database_url)
    cluster = NatsCluster(workdir / "cluster") if scenario is Scenario.CLUSTER_FAILOVER else None
    workers: list[WorkerProcess] = []
    client: FleetClient | None = None
    try:
        nats_urls = (stack.nats_url,) if cluster is None else await asyncio.to_thread(cluster.start)
        await reset_streams(nats_urls, replicas=len(nats_urls))
        env = worker_env(
            ",".join(nats_urls),
            database_url,
            workdir / "data",
            TEST_PARTITIONS,
            max_event_bytes=str(MAX_EVENT_BYTES),
            shutdown_timeout_s="10",
        )
        workers = _worker_processes(env, workdir, count=1 if cluster is None else 2)
        for worker in workers:
            worker.start()
        for worker in workers:
            await worker.wait_ready()
        client = await connect_client(nats_urls, f"chaos-{scenario.value}")
        run = _Run(stack, cluster, workers, store, client, scenario, scale, random.Random(seed), report)
        await run.drive()
        await run.verify()
    finally:
        if client is not None:
            await client.close()
        await store.close()
        for worker in workers:
            code = await asyncio.to_thread(worker.stop)
            if code not in (0, None):
                report.unbounded_shutdowns += 1
                report.notes.append(f"the last worker exited with {code} on SIGTERM; see {worker.log}")
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        await stack.drop_database(database_url)
    report.elapsed_s = round(time.monotonic() - started, 1)
    return report


def _worker_processes(env: dict[str, str], workdir: Path, *, count: int) -> list[WorkerProcess]:
    """``count`` processes of all five workers, each recording its share of the partitions."""
    if count == 1:
        return [WorkerProcess(env, workdir)]
    # A worker started again while the cluster elects leaders waits for them, as under a supervisor.
    shared = {**env, "CTX_STARTUP_WAIT_S": "30"}
    return [
        WorkerProcess({**shared, "CTX_RECORDER_PARTITIONS": f"{i}/{count}"}, workdir / f"worker-{i}")
        for i in range(count)
    ]


class _Run:
    """One scenario in flight: the runtimes, the injected faults, and the verdicts."""

    def __init__(
        self,
        stack: Stack,
        cluster: NatsCluster | None,
        workers: Sequence[WorkerProcess],
        store: Store,
        client: FleetClient,
        scenario: Scenario,
        scale: Scale,
        rng: random.Random,
        report: ScenarioReport,
    ) -> None:
        self.stack, self.cluster, self.workers = stack, cluster, workers
        self.store, self.client = store, client
        self.scenario, self.scale, self.rng, self.report = scenario, scale, rng, report
        pace = scale.load_s / scale.events
        dup_rate = 0.1 if scenario is Scenario.DUPLICATES else 0.02
        self.runtimes = [
            Runtime(
                client,
                t,
                plan_events(t, scale.events),
                pace,
                scale.prepare_every,
                dup_rate,
                random.Random(rng.random()),
                late_rate=0.05 if scenario is Scenario.DUPLICATES else 0.0,
            )
            for t in (Thread() for _ in range(scale.sessions))
        ]
        self.canary = Runtime(client, Thread(), [], 0.0, 1_000_000, 0.0, random.Random(0))
        self.poisoned: list[tuple[Poison, int]] = []  # each invalid input and its stream seq
        self.deadline = time.monotonic() + scale.load_bound_s

    def _progress(self) -> float:
        return sum(len(r.acked) for r in self.runtimes) / (self.scale.sessions * self.scale.events)

    async def drive(self) -> None:
        """Run the load, inject the faults as it goes, then wait for what must be recorded."""
        load = [asyncio.create_task(r.run(self.deadline)) for r in self.runtimes]
        try:
            for n in range(self.scale.faults):
                await self._until_progress((n + 1) / (self.scale.faults + 1))
                await self._inject(n)
            results = await asyncio.gather(*load, return_exceptions=True)
        finally:
            for task in load:
                task.cancel()
        for result in results:
            if isinstance(result, BaseException):
                self.report.notes.append(f"runtime gave up: {result}")
        if self.scenario is Scenario.DUPLICATES:
            # Long after: once the load (and its fresh acks) are over, the old copies arrive.
            self.report.duplicates_sent += sum([await r.send_late() for r in self.runtimes])
        await self._settle()

    async def _until_progress(self, fraction: float) -> None:
        async def reached() -> bool:
            return self._progress() >= fraction

        await _within(reached, max(0.0, self.deadline - time.monotonic()))

    async def _inject(self, n: int) -> None:
        """Inject the scenario's fault once, clear it, and measure the recovery."""
        s = self.stack
        match self.scenario:
            case Scenario.FLEET_KILL:
                self._kill_workers()
                s.kill_nats()
                s.kill_postgres()
                await asyncio.sleep(self.scale.outage_s)  # the outage: runtimes keep retrying
                await asyncio.to_thread(s.start_postgres)
                await asyncio.to_thread(s.start_nats)
                self._start_workers()
            case Scenario.WORKER_KILL:
                self._kill_workers()
                self._start_workers()
            case Scenario.POSTGRES_RESTART:
                await asyncio.to_thread(s.stop_postgres)
                await asyncio.sleep(self.scale.outage_s)
                await asyncio.to_thread(s.start_postgres)
            case Scenario.POSTGRES_KILL:
                s.kill_postgres()
                await asyncio.sleep(self.scale.outage_s)
                await asyncio.to_thread(s.start_postgres)
            case Scenario.NATS_RESTART:
                await asyncio.to_thread(s.stop_nats)
                await asyncio.sleep(self.scale.outage_s)
                await asyncio.to_thread(s.start_nats)
            case Scenario.DUPLICATES:
                return  # the runtimes inject them (10%), and the late copies after the load
            case Scenario.POISON:
                await self._poison(n)
                return
            case Scenario.CLUSTER_FAILOVER:
                await self._fail_over(n)
                return
            case _:
                assert_never(self.scenario)
        self.report.faults += 1
        await self._measure_recovery(time.monotonic(), n)

    def _kill_workers(self) -> None:
        for worker in self.workers:
            worker.kill()

    def _start_workers(self) -> None:
        for worker in self.workers:
            worker.start()

    async def _fail_over(self, n: int) -> None:
        """Kill the events stream's leader node and one worker; recover without the node, then let
        it rejoin (and catch up) before anything else happens, so a next fault cannot take a quorum."""
        assert self.cluster is not None
        js = self.client._nc.jetstream(timeout=10.0)
        leader = (await js.stream_info(EVENTS_STREAM)).cluster
        assert leader is not None and leader.leader is not None, "the events stream is not replicated"
        node = self.cluster.node_named(leader.leader)
        victim = self.workers[n % len(self.workers)]
        self.cluster.kill(node)
        victim.kill()
        killed = time.monotonic()
        victim.start()  # as its supervisor would, at once; the node stays down while the fleet recovers
        self.report.faults += 1
        await self._measure_recovery(killed, n)
        after = (await js.stream_info(EVENTS_STREAM)).cluster
        self.report.notes.append(
            f"fault {n}: killed {leader.leader}, the events stream's leader, and worker"
            f" {n % len(self.workers)}; its leader is now {after.leader if after else None}"
        )
        await asyncio.to_thread(self.cluster.start_node, node)

        cluster = self.cluster

        async def rejoined() -> bool:
            return await asyncio.to_thread(cluster.healthy, node)

        if not await _within(rejoined, self.scale.stuck_bound_s):
            self.report.notes.append(
                f"fault {n}: {leader.leader} not healthy again within {self.scale.stuck_bound_s}s"
            )

    async def _poison(self, n: int) -> None:
        """Publish every invalid input, one at a time, into the partitions of valid sessions."""
        # Under a valid thread's own envelope, so each input reaches the check it is aimed at.
        t = self.runtimes[n % len(self.runtimes)].thread
        for j, poison in enumerate(poison_inputs(t, self.rng, max_event_bytes=MAX_EVENT_BYTES)):
            ack = await self.client.append_raw(
                t.thread_id, f"bad-{n}-{j}", poison.data, session_id=t.session_id
            )
            self.poisoned.append((poison, ack.stream_seq))
            self.report.invalid_sent += 1
            self.report.faults += 1
            await asyncio.sleep(self.scale.load_s / 50)  # spread among the valid events

    async def _measure_recovery(self, cleared: float, n: int) -> None:
        try:
            for worker in self.workers:
                await worker.wait_ready(timeout=self.scale.stuck_bound_s)
        except AssertionError as exc:
            self.report.notes.append(f"fault {n}: not ready again: {str(exc)[:200]}")
            return
        self.report.ready_s = round(max(self.report.ready_s or 0.0, time.monotonic() - cleared), 2)
        key = f"canary-{n}"
        await self.canary.send(self.canary.thread.user(f"canary after fault {n}", key=key), self.deadline)

        async def recorded() -> bool:
            rows = await self.store.fetch(
                "SELECT 1 FROM ctx.records WHERE thread_id=$1 AND event_key=$2",
                self.canary.thread.thread_id,
                key,
            )
            return bool(rows)

        if await _within(recorded, self.scale.stuck_bound_s):
            self.report.recover_s = round(max(self.report.recover_s or 0.0, time.monotonic() - cleared), 2)
        else:
            self.report.notes.append(f"fault {n}: canary not recorded within {self.scale.stuck_bound_s}s")

    async def _settle(self) -> None:
        """Wait (bounded) until every acknowledged valid event is in the ledger."""
        expected = {r.thread.thread_id: len(r.acked) for r in (*self.runtimes, self.canary) if r.acked}

        async def all_recorded() -> bool:
            rows = await self.store.fetch(
                "SELECT thread_id, count(*) AS n FROM ctx.records GROUP BY thread_id"
            )
            have = {r["thread_id"]: r["n"] for r in rows or ()}
            return all(have.get(t, 0) >= n for t, n in expected.items())

        await _within(all_recorded, self.scale.stuck_bound_s)

    async def verify(self) -> None:
        """Check every invariant and fill in the report."""
        r = self.report
        everyone = [*self.runtimes, self.canary]
        r.events = sum(len(x.acked) for x in everyone)
        r.unacked = sum(len(x.events) - len(x.acked) for x in self.runtimes)
        r.publishes = sum(x.publishes for x in everyone) + r.invalid_sent
        r.duplicates_sent += sum(x.duplicates_sent for x in everyone)
        r.prepares = sum(x.prepares for x in self.runtimes)
        errors: Counter[str] = Counter()
        for x in self.runtimes:
            errors.update(x.prepare_errors)
        r.prepare_errors = dict(errors)
        if self.scenario is Scenario.DUPLICATES:
            r.faults = r.duplicates_sent
        for runtime in everyone:
            if runtime.acked:
                await self._verify_thread(runtime)
        await self._verify_dead_letters()
        for runtime in self.runtimes:
            await self._final_prepare(runtime)

    async def _verify_thread(self, runtime: Runtime) -> None:
        r, t = self.report, runtime.thread
        try:
            audit = await audit_thread(await self.store.connection(), self.client, t.thread_id, runtime.acked)
        except CtxError as exc:
            r.chain_failures += 1
            r.notes.append(f"{t.thread_id}: inspect failed: {exc.code.value}: {exc.message}")
            return
        if audit.missing:
            in_stream = await _stream_keys(self.client, t)
            stuck = sum(1 for k in audit.missing if k in in_stream)
            r.stuck += stuck
            r.lost += len(audit.missing) - stuck
            r.notes.append(f"{t.thread_id}: {len(audit.missing)} not recorded, first {audit.missing[0]}")
        r.duplicated += audit.duplicated
        r.reordered += audit.reordered
        r.chain_failures += not audit.chain_ok
        r.replay_failures += not audit.replay_ok
        self._note_audit(audit)

    def _note_audit(self, audit: ThreadAudit) -> None:
        if audit.unexpected:
            self.report.dead_letter_errors += len(audit.unexpected)
            self.report.notes.append(
                f"{audit.thread_id}: recorded invalid input {', '.join(audit.unexpected[:3])}"
            )
        if not audit.chain_ok:
            self.report.notes.append(f"{audit.thread_id}: chain: {audit.inspection.chain_error or 'seq gap'}")

    async def _verify_dead_letters(self) -> None:
        r = self.report
        rows = await self.store.fetch("SELECT stream_seq, code FROM ctx.dead_letters") or []
        codes = {row["stream_seq"]: row["code"] for row in rows}
        wanted = {seq for _, seq in self.poisoned}
        for poison, seq in self.poisoned:
            code = codes.get(seq)
            r.dead_letter_codes[poison.name] = code or "NOT DEAD-LETTERED"
            r.dead_letter_errors += not code
        extra = [seq for seq in codes if seq not in wanted]
        if extra:
            r.dead_letter_errors += len(extra)
            r.notes.append(
                f"{len(extra)} unexpected dead letters: {sorted(Counter(codes[s] for s in extra).items())}"
            )
        js = self.client._nc.jetstream(timeout=10.0)
        in_stream = (await js.stream_info(DEAD_STREAM)).state.messages
        if in_stream != len(rows):
            r.dead_letter_errors += abs(in_stream - len(rows))
            r.notes.append(f"CTX_DEAD holds {in_stream} letters, ctx.dead_letters {len(rows)}")

    async def _final_prepare(self, runtime: Runtime) -> None:
        t = runtime.thread
        if not runtime.acked:
            return
        request = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            budget_tokens=16_000,
            after_event_key=runtime.acked[-1],
            wait_ms=10_000,
        )
        try:
            await self.client.prepare(request, timeout=20.0)
        except CtxError as exc:
            self.report.unserved += 1
            self.report.notes.append(f"{t.thread_id}: final prepare: {exc.code.value}: {exc.message[:120]}")


async def _within(check: Callable[[], Awaitable[bool]], bound_s: float) -> bool:
    """Whether ``check`` comes to hold within ``bound_s``: a verdict to report, not a test failure."""
    try:
        await eventually(check, timeout=bound_s)
    except AssertionError:
        return False
    return True


async def _stream_keys(client: FleetClient, t: Thread) -> set[str]:
    """The event keys the events stream still holds for one thread (stuck there, or lost)."""
    js = client._nc.jetstream(timeout=10.0)
    sub = await js.subscribe(
        f"{PARTITIONED}.*.{t.session_id}.{t.thread_id}", stream=EVENTS_STREAM, ordered_consumer=True
    )
    keys: set[str] = set()
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2)
            except TimeoutError:
                return keys
            try:
                keys.add(str(json.loads(msg.data)["event_key"]))
            except (ValueError, KeyError, TypeError, RecursionError):
                pass  # an invalid input of this thread (the nesting poison defeats json itself)
            if msg.metadata.num_pending == 0:
                return keys
    finally:
        await sub.unsubscribe()
