"""A JetStream cluster of nats-servers on loopback: the multi-node recipe's broker, and the tests'.

Each node is an ``EmbeddedNats`` with a store of its own, a client port and a route port, every node
routed to every other. The ports are chosen free on the first start and written down in the folder
(``cluster.json``), so the folder's cluster comes back on the URLs its clients were given.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .embedded import EmbeddedNats, EmbeddedServerError, free_port

__all__ = ["NatsCluster"]

_PORTS = "cluster.json"
_PORT_KINDS = ("client", "route", "monitor")


@dataclass
class NatsCluster:
    """``size`` routed nats-servers with JetStream, their stores under ``data_dir/n1``, ``n2``…"""

    data_dir: Path
    size: int = 3
    name: str = "ctxfleet"
    # Appended to every node's config (an authorization block, say).
    extra_config: str = ""
    sync_always: bool = True
    nodes: list[EmbeddedNats] = field(default_factory=list)
    _monitor: list[int] = field(default_factory=list)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node's client URL, in node order: what ``CTX_NATS_URL`` names, comma-separated."""
        return tuple(node.url for node in self.nodes)

    def server_name(self, index: int) -> str:
        """The ``server_name`` of node ``index`` (0-based), as JetStream reports its leaders."""
        return f"{self.name}-n{index + 1}"

    def node_named(self, server_name: str) -> int:
        """The index of the node JetStream calls ``server_name``."""
        for index in range(len(self.nodes)):
            if self.server_name(index) == server_name:
                return index
        raise KeyError(f"no node of this cluster is named {server_name!r}")

    def start(self, timeout: float = 60.0) -> tuple[str, ...]:
        """Start every node and wait until each is healthy (JetStream ready); returns the URLs."""
        if self.size < 1:
            raise ValueError("a cluster needs at least one node")
        client_ports, route_ports, self._monitor = self._ports()
        routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
        self.nodes = [
            EmbeddedNats(
                self.data_dir / f"n{i + 1}",
                port=client_ports[i],
                sync_always=self.sync_always,
                server_name=self.server_name(i),
                extra_config="\n".join(
                    [
                        f"http: 127.0.0.1:{self._monitor[i]}",
                        "cluster {",
                        f"  name: {self.name}",
                        f"  listen: 127.0.0.1:{route_ports[i]}",
                        f"  routes: [{routes}]",
                        "}",
                        self.extra_config,
                    ]
                ),
            )
            for i in range(self.size)
        ]
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            self._until_healthy(deadline)
        except BaseException:
            self.stop()
            raise
        return self.urls

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``: what it had not replicated or written is gone with it."""
        proc = self.nodes[index].process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def start_node(self, index: int, timeout: float = 15.0) -> None:
        """Start node ``index`` again on its ports and store; it rejoins and catches up by itself."""
        self.nodes[index].start(timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL); the stores stay."""
        for node in self.nodes:
            node.stop()

    def _ports(self) -> tuple[list[int], list[int], list[int]]:
        """Client, route and monitoring ports, one of each per node: as written down, else free ones."""
        path = self.data_dir / _PORTS
        try:
            written = json.loads(path.read_text())
            ports = tuple([int(p) for p in written[kind]] for kind in _PORT_KINDS)
            if all(len(kind) == self.size for kind in ports):
                return ports[0], ports[1], ports[2]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a new folder, or one written for another size: choose anew
        chosen = {kind: [free_port() for _ in range(self.size)] for kind in _PORT_KINDS}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(chosen) + "\n")
        return chosen["client"], chosen["route"], chosen["monitor"]

    def healthy(self, index: int) -> bool:
        """Whether node ``index`` says it is healthy: up, JetStream on, a meta leader known and every
        stream and consumer it holds a copy of caught up (nats-server's ``/healthz``)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._monitor[index]}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:  # refused while down, HTTP 503 while catching up
            return False

    def _until_healthy(self, deadline: float) -> None:
        for index in range(self.size):
            while not self.healthy(index):
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(
                        f"node {self.server_name(index)} of the JetStream cluster under {self.data_dir} "
                        f"is not healthy; see {self.nodes[index].log_path}"
                    )
                time.sleep(0.1)
