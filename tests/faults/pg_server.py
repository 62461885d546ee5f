"""A private PostgreSQL server that a test may stop and start: never the shared one.

The server is made from the binaries of the machine's PostgreSQL (``initdb``, ``pg_ctl``),
found under ``/usr/lib/postgresql/*/bin`` (the newest) or in ``AGENTSNAP_PG_BIN``. Its data
directory is a fresh temporary directory; it listens on 127.0.0.1 only, on a free port of its
own, with trust authentication and ``fsync=off`` (nothing here needs to survive a power cut).
PostgreSQL refuses to run as root, so as root it runs as the ``postgres`` user
(``runuser -u postgres --``), which then owns the directory::

    with PostgresServer.create() as server:
        url = server.create_database("faults_1")
        server.stop()   # fast shutdown: clients get "terminating connection" at once
        server.start()  # same port, same data
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg
from psycopg import sql

__all__ = ["PostgresServer", "PostgresUnavailable", "find_binaries"]

BIN_VARIABLE = "AGENTSNAP_PG_BIN"
_SERVICE_USER = "postgres"
_START_TIMEOUT = 60
_names = itertools.count(1)


class PostgresUnavailable(Exception):
    """No private PostgreSQL server can be made here; the message says why."""


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Raises:
        PostgresUnavailable: Neither ``AGENTSNAP_PG_BIN`` nor ``/usr/lib/postgresql/*/bin``
            has them.
    """
    given = os.environ.get(BIN_VARIABLE)
    candidates = (
        [Path(given)]
        if given
        else sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda path: _version(path.parent.name),
            reverse=True,
        )
    )
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    where = given or "/usr/lib/postgresql/*/bin"
    raise PostgresUnavailable(
        f"no PostgreSQL server binaries (initdb, pg_ctl, postgres) in {where}; install the "
        f"server package or set {BIN_VARIABLE}"
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class PostgresServer:
    """A PostgreSQL server in its own data directory, on its own port.

    Use [`create`][] to make one; it is running when returned.

    Args:
        base: Directory holding ``data/``, the log and the socket; removed by ``close()``.
        binaries: Where ``initdb`` and ``pg_ctl`` are.
        port: The port it listens on.

    Attributes:
        host: Always ``127.0.0.1``.
        port: The server's port (kept across stop and start).
    """

    host = "127.0.0.1"

    def __init__(self, base: Path, binaries: Path, port: int) -> None:
        self.base = base
        self.binaries = binaries
        self.port = port
        self.data = base / "data"
        self.log = base / "server.log"
        self._as_user: list[str] = []

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"PostgresServer({self.host}:{self.port}, {self.data}, {state})"

    @classmethod
    def create(cls, parent: Path | None = None) -> PostgresServer:
        """Make a data directory with ``initdb`` and start a server on it.

        Args:
            parent: Where to make the directory (the system's temporary directory by default;
                as root it must be one the ``postgres`` user can reach).

        Raises:
            PostgresUnavailable: The binaries are missing, or (as root) there is no
                ``postgres`` user to run them as.
        """
        binaries = find_binaries()
        base = Path(tempfile.mkdtemp(prefix="agentsnap-faults-pg-", dir=parent))
        server = cls(base, binaries, free_port())
        try:
            server._prepare()
            server._initdb()
            server._configure()
            server.start()
        except BaseException:
            server.close()
            raise
        return server

    # -- life cycle -------------------------------------------------------------------------

    def is_running(self) -> bool:
        """Whether a postmaster runs on the data directory."""
        if not (self.data / "postmaster.pid").exists():
            return False
        status = self._run(["pg_ctl", "status", "-D", str(self.data)], check=False)
        return status.returncode == 0

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        if self.is_running():
            return
        self._run(
            [
                "pg_ctl",
                "start",
                "-w",
                "-t",
                str(_START_TIMEOUT),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
            ],
            timeout=_START_TIMEOUT + 10,
        )

    def stop(self) -> None:
        """Stop the server at once (fast shutdown: open sessions are terminated)."""
        if not self.is_running():
            return
        self._run(
            ["pg_ctl", "stop", "-w", "-m", "fast", "-t", str(_START_TIMEOUT), "-D", str(self.data)],
            timeout=_START_TIMEOUT + 10,
        )

    def restart(self) -> None:
        """Stop, then start."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server (immediately) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            self._run(
                ["pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data)],
                check=False,
                timeout=_START_TIMEOUT,
            )
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- databases --------------------------------------------------------------------------

    def url_for(self, database: str = "postgres", *, port: int | None = None) -> str:
        """The URL of ``database`` on this server (or at ``port``: a proxy in front of it)."""
        return f"postgresql://{_SERVICE_USER}@{self.host}:{port or self.port}/{database}"

    @property
    def url(self) -> str:
        """The URL of the ``postgres`` database."""
        return self.url_for()

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh name by default) and return its URL."""
        name = name or f"faults_{os.getpid()}_{next(_names)}"
        with psycopg.connect(self._admin_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending its sessions first; nothing if the server is down."""
        if not self.is_running():
            return
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self._admin_dsn(), autocommit=True) as conn,
        ):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def _admin_dsn(self) -> str:
        return f"host={self.host} port={self.port} user={_SERVICE_USER} dbname=postgres"

    # -- plumbing ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        """As root: run everything as ``postgres``, who must own the directory."""
        if os.geteuid() != 0:
            return
        try:
            user = pwd.getpwnam(_SERVICE_USER)
        except KeyError:
            raise PostgresUnavailable(
                "running as root, and PostgreSQL refuses to: there is no 'postgres' user to "
                "run the server as"
            ) from None
        os.chown(self.base, user.pw_uid, user.pw_gid)
        runuser = shutil.which("runuser")
        if runuser is None:
            raise PostgresUnavailable("running as root, without runuser to run as postgres")
        self._as_user = [runuser, "-u", _SERVICE_USER, "--"]

    def _initdb(self) -> None:
        self._run(
            [
                *("initdb", "-D", str(self.data), "-U", _SERVICE_USER, "-A", "trust"),
                *("-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"),
            ],
            timeout=120,
        )

    def _configure(self) -> None:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.base}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "logging_collector": "off",
        }
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# agentsnap fault tests\n" + lines)

    def _run(
        self, argv: list[str], *, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = [*self._as_user, str(self.binaries / argv[0]), *argv[1:]]
        done = subprocess.run(  # noqa: PLW1510  # checked below, with the output
            command, capture_output=True, text=True, timeout=timeout, cwd=self.base
        )
        if check and done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()}"
                f"{done.stdout.strip()}\n{log}"
            )
        return done
