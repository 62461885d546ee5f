"""Hosts on one machine: network namespaces joined to NATS and PostgreSQL by veth links.

Distributed runs are tested here as they are deployed: each worker on a host of its own,
reaching the NATS server and the PostgreSQL server over the network, where a link can be cut.
[`Hosts`][] builds, with ``ip`` (iproute2) as root:

- two Linux bridges in the root namespace, one per service, each with an address of a
  private ``/24`` nobody on the machine uses: the NATS server of the test
  ([`nats_server.OwnServer`][] on the NATS bridge's address) and a PostgreSQL cluster of the
  test's own ([`OwnPostgres`][], ``initdb`` into a temporary directory, on the PostgreSQL
  bridge's address and a free port) listen there, and nowhere else;
- per host, a network namespace with two veth links, one to each bridge (its addresses end in
  ``10 + n``), and its loopback up.

A process started with [`Hosts.command`][] runs in host ``n``'s namespace and reaches the
services only over its two links; the test process, in the root namespace, reaches them
through the bridges' addresses without crossing a link. [`Hosts.cut`][] partitions a host
from NATS, from PostgreSQL or from both, by taking the root side of the link down (the
host's interface loses its carrier: packets are dropped both ways and TCP connections stall,
as when a switch port dies) or by routing the addresses away on both sides (``unreachable``
routes: packets are refused where they are sent, as when a router rejects them);
[`Hosts.heal`][] puts everything back. (``tc netem`` is not used: kernels built without
``sch_netem``, as CI's is, refuse it.)

Every name carries a token unique to the ``Hosts`` (and the test process's pid, which the
state directory records): closing removes the namespaces (killing what still runs in them),
the bridges and the state, on every exit path; a test process killed outright leaves them to
the next ``Hosts`` of any test process, which sweeps away whatever a dead process left.

The tests using it skip, saying why, when not run as root or without ``ip``; anywhere else
(CI runs as root) they run.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

import pytest
from nats_server import OwnServer, free_port, reachable, server_binary

Service = Literal["nats", "postgres"]
How = Literal["down", "unreachable"]

STATE = Path(tempfile.gettempdir()) / "agentsnap-netns"
"""Where each ``Hosts`` keeps its state: ``<pid>-<token>/`` (the cluster, the stream store)."""
PREFIX = "agentsnap-"
"""Namespaces are ``agentsnap-<pid>-<token>-<n>``; links and bridges start ``as<token>``."""
_LETTER: dict[Service, str] = {"nats": "n", "postgres": "p"}


def missing() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip``), or ``None``."""
    if os.geteuid() != 0:
        return "network namespaces need root (the partition tests run as root in CI)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces with"
    return None


def skip_unless_possible() -> None:
    """Skip the test, saying why, unless namespaces can be made here."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)


def ip(*args: str) -> None:
    """Run ``ip args``; raise with what it printed when it fails."""
    _run(["ip", *args])


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` random ``/24`` networks in 10.200/13 that no interface of the machine uses."""
    shown = _run(["ip", "-o", "-4", "addr", "show"]).stdout.split()
    used = [ipaddress.ip_interface(word).network for word in shown if "/" in word]
    chosen: list[ipaddress.IPv4Network] = []
    while len(chosen) < count:
        net = ipaddress.IPv4Network(
            f"10.{secrets.choice(range(200, 208))}.{secrets.randbelow(256)}.0/24"
        )
        if net not in chosen and not any(net.overlaps(other) for other in used):
            chosen.append(net)
    return chosen


def _kill_namespace(namespace: str) -> None:
    """Kill what runs in ``namespace`` (SIGKILL) and delete it."""
    pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run(["ip", "netns", "delete", namespace], check=False)


def _kill_services(state: Path) -> None:
    """Stop the NATS server and the cluster a ``Hosts`` started under ``state``."""
    data = state / "postgres" / "data"
    pid_file = data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError, IndexError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
    for pid_file in state.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            # Only a process still running from this state directory (pids are reused).
            if str(state) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(pid, signal.SIGKILL)


def sweep() -> list[str]:
    """Remove what ``Hosts`` of test processes that no longer run left; return its tokens."""
    swept: list[str] = []
    if not STATE.exists():
        return swept
    for state in STATE.iterdir():
        pid_text, _, token = state.name.partition("-")
        if not pid_text.isdigit() or not token or _alive(int(pid_text)):
            continue
        _remove(int(pid_text), token, state)
        swept.append(token)
    return swept


def _remove(pid: int, token: str, state: Path) -> None:
    for namespace in _run(["ip", "netns", "list"], check=False).stdout.split():
        if namespace.startswith(f"{PREFIX}{pid}-{token}-"):
            _kill_namespace(namespace)
    for letter in _LETTER.values():
        _run(["ip", "link", "delete", f"as{token}{letter}b"], check=False)
    # Routes that cut a host off in the root namespace outlive the bridges: the nets say whose.
    nets_file = state / "nets"
    nets = (
        [ipaddress.IPv4Network(n) for n in nets_file.read_text().split()]
        if nets_file.exists()
        else []
    )
    for line in _run(
        ["ip", "-o", "route", "show", "type", "unreachable"], check=False
    ).stdout.splitlines():
        words = line.split()
        with contextlib.suppress(ValueError, IndexError):
            if any(ipaddress.IPv4Network(words[1]).subnet_of(net) for net in nets):
                _run(["ip", "route", "del", *words[:2]], check=False)
    _kill_services(state)
    shutil.rmtree(state, ignore_errors=True)


class OwnPostgres:
    """A PostgreSQL cluster of a test's own, under ``directory``, on ``address``.

    ``start`` runs ``initdb`` and starts the server on a free port of ``address`` (and a
    socket in ``directory``), trusting the clients on the networks it is connected to.

    It runs as the ``postgres`` user (the server refuses root), with ``fsync`` off: nothing
    here survives the test, and the server itself is never crashed.
    """

    def __init__(self, directory: Path, address: str) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not found:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
        self.bin = found[-1].parent
        self.directory = directory
        self.address = address
        self.port = free_port()
        self.url = f"postgresql://postgres@{address}:{self.port}/postgres"

    def _as_postgres(self, program: str, *args: str) -> None:
        _run(["runuser", "-u", "postgres", "--", str(self.bin / program), *args])

    def start(self) -> None:
        """Create the cluster and start it; return once it accepts connections."""
        data = self.directory / "data"
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.directory, "postgres", "postgres")
        self._as_postgres("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                          "--no-sync", "--no-instructions")  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:  # the hosts connect over the bridge
            hba.write("host all all samenet trust\n")
        options = f"-c listen_addresses={self.address} -p {self.port} -k {self.directory} "
        options += "-c fsync=off -c full_page_writes=off -c max_connections=200 "
        options += "-c log_lock_waits=on"  # a lock held by a host cut off shows in the log
        self._as_postgres("pg_ctl", "-D", str(data), "-l", str(self.directory / "log"), "-w",
                          "-t", "60", "-o", options, "start")  # fmt: skip

    def log_tail(self, size: int = 4000) -> str:
        """The end of the server's log (for a failing test's message)."""
        log = self.directory / "log"
        return log.read_text(errors="replace")[-size:] if log.exists() else ""

    def stop(self) -> None:
        """Stop the server (at once); nothing when it is not running."""
        data = self.directory / "data"
        if (data / "postmaster.pid").exists():
            _run(["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), "-D", str(data),
                  "-m", "immediate", "-w", "stop"], check=False)  # fmt: skip


class Hosts:
    """``count`` hosts (network namespaces), and a NATS server and a PostgreSQL cluster.

    The hosts reach the services over their links. A context manager: everything goes on
    leaving it (or on ``close``).

    Attributes:
        nats: The test's NATS server (JetStream on), on the NATS bridge; ``nats.url``.
        postgres: The test's PostgreSQL cluster, on the PostgreSQL bridge; ``postgres.url``.
        namespaces: Each host's network namespace, by host number.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.token = secrets.token_hex(3)
        self.state = STATE / f"{os.getpid()}-{self.token}"
        self.namespaces = [f"{PREFIX}{os.getpid()}-{self.token}-{n}" for n in range(count)]
        self.nets = dict(zip(_LETTER, _free_subnets(len(_LETTER)), strict=True))
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no nats-server binary (install the nats-server package)")
        self.nats = OwnServer(binary, self.state / "jetstream", host=self.address("nats"))
        self.postgres = OwnPostgres(self.state / "postgres", self.address("postgres"))
        self._impaired: dict[tuple[int, Service], How] = {}

    # -- names and addresses ----------------------------------------------------------------

    def bridge(self, service: Service) -> str:
        """The bridge (in the root namespace) that ``service`` listens on."""
        return f"as{self.token}{_LETTER[service]}b"

    def link(self, host: int, service: Service, *, inside: bool = False) -> str:
        """Host ``host``'s link to ``service``: its root end, or the end in its namespace."""
        return f"as{self.token}{_LETTER[service]}{host}{'' if inside else 'h'}"

    def address(self, service: Service, host: int | None = None) -> str:
        """The service's address (``host=None``), or host ``host``'s on that service's net."""
        net = self.nets[service]
        return str(net.network_address + (1 if host is None else 10 + host))

    # -- building and removing --------------------------------------------------------------

    def __enter__(self) -> Hosts:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Sweep what dead test processes left, then build the bridges, hosts and services."""
        sweep()
        self.state.mkdir(parents=True)
        self.state.chmod(0o755)  # the cluster's user must reach its directory
        (self.state / "nets").write_text(" ".join(str(net) for net in self.nets.values()))
        for service, net in self.nets.items():
            bridge = self.bridge(service)
            ip("link", "add", bridge, "type", "bridge")
            ip("addr", "add", f"{self.address(service)}/{net.prefixlen}", "dev", bridge)
            ip("link", "set", bridge, "up")
        for host, namespace in enumerate(self.namespaces):
            ip("netns", "add", namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
            for service, net in self.nets.items():
                outside, inside = self.link(host, service), self.link(host, service, inside=True)
                ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                ip("link", "set", inside, "netns", namespace)
                ip("link", "set", outside, "master", self.bridge(service), "up")
                address = f"{self.address(service, host)}/{net.prefixlen}"
                ip("-n", namespace, "addr", "add", address, "dev", inside)
                ip("-n", namespace, "link", "set", inside, "up")
        self.start_nats()
        self.postgres.start()
        for host in range(self.count):
            for service in self.nets:
                self._until_reachable(host, service)

    def _until_reachable(self, host: int, service: Service) -> None:
        """Wait until host ``host`` reaches ``service`` (a new link may take a moment)."""
        deadline = time.monotonic() + 20
        while not self.reaches(host, service):
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {host} does not reach {service} over its link")
            time.sleep(0.1)

    def close(self) -> None:
        """Remove everything: the hosts' processes and namespaces, the bridges, the services."""
        with contextlib.suppress(RuntimeError):
            self.heal()  # the routes in the root namespace go with the bridges' nets
        for namespace in self.namespaces:
            _kill_namespace(namespace)
        with contextlib.suppress(Exception):
            self.nats.stop()
        self.postgres.stop()
        _remove(os.getpid(), self.token, self.state)

    # -- using them -------------------------------------------------------------------------

    def start_nats(self) -> None:
        """Start the NATS server (again: same address, port and storage)."""
        self.nats.start()
        (self.state / "nats.pid").write_text(str(self.nats.pid))

    def stop_nats(self) -> None:
        """Stop the NATS server, as an operator restarting it does (SIGTERM)."""
        self.nats.stop()

    def command(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``host`` (in its network namespace)."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def cut(self, host: int, services: tuple[Service, ...], how: How = "down") -> None:
        """Partition host ``host`` from ``services``, both ways, until ``heal``.

        ``down`` takes the root end of each link down: packets are dropped silently and
        connections stall until the link is back. ``unreachable`` routes the service's
        address away on the host and the host's address away at the service: each side's
        packets are refused where they are sent, so connecting fails at once and open
        connections see errors.
        """
        for service in services:
            if how == "down":
                ip("link", "set", self.link(host, service), "down")
            else:
                ip("-n", self.namespaces[host], "route", "add", "unreachable",
                   f"{self.address(service)}/32")  # fmt: skip
                ip("route", "add", "unreachable", f"{self.address(service, host)}/32")
            self._impaired[host, service] = how

    def heal(self, host: int | None = None) -> None:
        """Reconnect host ``host`` (every host: ``None``) to everything it was cut from."""
        for (at, service), how in sorted(self._impaired.items()):
            if host is not None and at != host:
                continue
            if how == "down":
                ip("link", "set", self.link(at, service), "up")
            else:
                ip("-n", self.namespaces[at], "route", "del", "unreachable",
                   f"{self.address(service)}/32")  # fmt: skip
                ip("route", "del", "unreachable", f"{self.address(service, at)}/32")
            del self._impaired[at, service]

    def reaches(self, host: int, service: Service) -> bool:
        """Whether host ``host`` can open a connection to ``service`` now (one second)."""
        port = self.nats.port if service == "nats" else self.postgres.port
        probe = (
            "import socket\n"
            f"socket.create_connection(({self.address(service)!r}, {port}), 1).close()"
        )
        return _run(self.command(host, [sys.executable, "-c", probe]), check=False).returncode == 0


__all__ = [
    "Hosts",
    "OwnPostgres",
    "missing",
    "reachable",
    "skip_unless_possible",
    "sweep",
]
