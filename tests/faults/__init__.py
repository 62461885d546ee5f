"""Fault injection: a run on a real database that fails, and what the run makes of it.

Fixtures (``conftest.py``), each proven by ``test_fixtures.py`` with plain clients:

* ``proxy.py``: ``FaultProxy``, a TCP proxy with run-time modes pass, drop, refuse, delay,
  blackhole and heal;
* ``pg_server.py``: ``PostgresServer``, a private PostgreSQL server that a test may stop and
  start (never the shared one);
* ``sqlite_lock.py``: ``SqliteLockHolder``, another process holding SQLite's write lock;
* ``disk.py``: ``SmallDisk``, a tmpfs that fills up and frees again.

``workload.py`` is the run under fault and its ``FaultReport``; ``scenarios.py`` the five
faults; ``test_faults.py`` asserts the guarantees under each; ``report.py`` prints the figures::

    .venv/bin/python -m pytest tests/faults
    .venv/bin/python -m tests.faults.report
"""
