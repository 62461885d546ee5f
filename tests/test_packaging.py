"""The built wheel works once installed, away from the source tree.

A slow integration test (15 to 30 seconds with a warm pip cache): it builds the wheel, checks
its file list, installs it with its dependencies into a fresh virtual environment and runs the
installed ``agentsnap`` command and package from a directory outside the repository. It needs
the package index pip is configured with; when pip cannot reach it, every test here is skipped
with that reason.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# Generous ceilings, so a hung pip fails the test instead of stalling the suite.
BUILD_TIMEOUT = 180
INSTALL_TIMEOUT = 300
RUN_TIMEOUT = 60

# Files that must never reach the wheel, even if they lie around in ``migrations/``.
STRAY_SUFFIXES = (".pyc", ".db", ".db-wal", ".db-shm", ".sqlite", ".sqlite3")


@dataclass(frozen=True)
class Installed:
    """The wheel, and the virtual environment it is installed in."""

    wheel: Path
    venv: Path
    workdir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def agentsnap(self) -> Path:
        return self.venv / "bin" / "agentsnap"


def _outside_env() -> dict[str, str]:
    """The environment for the installed package: nothing points back at the repository."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PYTHON") and key not in {"VIRTUAL_ENV", "AGENTSNAP_DB"}
    }
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONWARNINGS"] = "error"
    return env


def _pip_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env.pop("PYTHONPATH", None)
    return env


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _pip(
    python: Path | str, args: list[str], *, cwd: Path, timeout: int, what: str
) -> subprocess.CompletedProcess[str]:
    """Run pip; skip when the package index cannot be reached, fail on any other error."""
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        cwd=cwd,
        env=_pip_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode == 0:
        return result
    unreachable = _index_unreachable(cwd)
    if unreachable is not None:
        pytest.skip(
            f"cannot test the installed wheel: pip cannot reach its package index ({unreachable})"
        )
    pytest.fail(
        f"{what} failed (exit {result.returncode}):\n{_tail(result.stdout)}\n{_tail(result.stderr)}"
    )


def _index_unreachable(workdir: Path) -> str | None:
    """pip's error when it cannot download the build backend, or ``None`` when it can."""
    backend = PYPROJECT["build-system"]["requires"][0]
    probe = workdir / "index-probe"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--timeout",
            "15",
            "--retries",
            "1",
            "--dest",
            str(probe),
            backend,
        ],
        cwd=workdir,
        env=_pip_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    if result.returncode == 0:
        return None
    lines = (result.stderr or result.stdout).strip().splitlines()
    return " | ".join(line.strip() for line in lines[-2:])


def _run(
    args: list[str | Path], installed: Installed, timeout: int = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run a program of the installed environment from the directory outside the repository."""
    result = subprocess.run(
        [str(arg) for arg in args],
        cwd=installed.workdir,
        env=_outside_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    command = " ".join(str(arg) for arg in args)
    assert result.returncode == 0, (
        f"`{command}` exited {result.returncode}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    assert result.stderr == "", f"`{command}` wrote to standard error:\n{result.stderr}"
    return result


def _newest_revision() -> str:
    """The head of the source migrations, read from the scripts without importing them."""
    revisions: dict[str, tuple[str, ...]] = {}
    for script in sorted((MIGRATIONS / "versions").glob("*.py")):
        values: dict[str, Any] = {}  # literal values as `ast.literal_eval` reads them
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in {"revision", "down_revision"}:
                        values[target.id] = ast.literal_eval(node.value)
        revision = values.get("revision")
        assert isinstance(revision, str), f"{script.name} declares no revision"
        down = values.get("down_revision")
        revisions[revision] = (
            () if down is None else (down,) if isinstance(down, str) else tuple(down)
        )
    referenced = {parent for parents in revisions.values() for parent in parents}
    heads = sorted(set(revisions) - referenced)
    assert len(heads) == 1, f"the source migrations should have one head, found {heads}"
    return heads[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from this checkout, installed into a fresh virtual environment."""
    base = tmp_path_factory.mktemp("packaging")
    assert not base.resolve().is_relative_to(ROOT), f"{base} is inside the repository"
    dist = base / "dist"
    _pip(
        sys.executable,
        ["wheel", "--no-deps", "--wheel-dir", str(dist), str(ROOT)],
        cwd=base,
        timeout=BUILD_TIMEOUT,
        what="building the wheel",
    )
    wheels = sorted(dist.glob("agentsnap-*.whl"))
    assert len(wheels) == 1, f"expected one agentsnap wheel in {dist}, found {wheels}"

    venv = base / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(venv)],
        cwd=base,
        env=_pip_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert made.returncode == 0, f"creating the virtual environment failed:\n{made.stderr}"
    _pip(
        venv / "bin" / "python",
        ["install", str(wheels[0])],
        cwd=base,
        timeout=INSTALL_TIMEOUT,
        what="installing the wheel",
    )
    workdir = base / "work"
    workdir.mkdir()
    return Installed(wheel=wheels[0], venv=venv, workdir=workdir)


def test_wheel_ships_the_migrations(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
    shipped = "agentsnap/_migrations"
    expected = {f"{shipped}/env.py", f"{shipped}/script.py.mako"}
    versions = sorted((MIGRATIONS / "versions").glob("*.py"))
    assert versions, f"no migration scripts in {MIGRATIONS / 'versions'}"
    expected |= {f"{shipped}/versions/{script.name}" for script in versions}
    if (ROOT / "agentsnap" / "py.typed").is_file():
        expected.add("agentsnap/py.typed")
    missing = sorted(expected - names)
    assert missing == [], f"{installed.wheel.name} lacks {missing}"

    stray = sorted(
        name
        for name in names
        if name.endswith(STRAY_SUFFIXES) or "__pycache__" in PurePosixPath(name).parts
    )
    assert stray == [], f"{installed.wheel.name} ships bytecode or database files: {stray}"
    top_level = {PurePosixPath(name).parts[0] for name in names}
    version = PYPROJECT["project"]["version"]
    assert top_level == {"agentsnap", f"agentsnap-{version}.dist-info"}


def test_installed_cli_upgrades_a_new_database(installed: Installed) -> None:
    newest = _newest_revision()
    url = f"sqlite:///{installed.workdir / 'cli.db'}"

    upgraded = _run([installed.agentsnap, "db", "upgrade", "--db", url], installed)
    assert upgraded.stdout.strip() == f"schema at {newest}"

    current = _run([installed.agentsnap, "db", "current", "--db", url], installed)
    assert current.stdout.strip() == f"{newest} (newest)"


def test_installed_cli_reports_its_version(installed: Installed) -> None:
    result = _run([installed.agentsnap, "--version"], installed)
    assert result.stdout.strip() == f"agentsnap, version {PYPROJECT['project']['version']}"


def test_installed_package_is_imported_from_site_packages(installed: Installed) -> None:
    script = installed.workdir / "check_installed.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio
            import sys
            import sysconfig
            from pathlib import Path

            import agentsnap
            from agentsnap.store import migrate
            from agentsnap.store.sql import SqlStore

            repo = Path(sys.argv[1]).resolve()
            site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
            package = Path(agentsnap.__file__).resolve().parent
            assert package == site_packages / "agentsnap", (package, site_packages)
            assert not package.is_relative_to(repo), package
            assert migrate.migrations_dir() == package / "_migrations", migrate.migrations_dir()


            async def main(url):
                store = SqlStore(url)
                try:
                    runs = await store.list_runs()
                finally:
                    await store.close()
                assert runs == [], runs


            asyncio.run(main(sys.argv[2]))
            print("ok", migrate.head())
            """
        ),
        encoding="utf-8",
    )
    url = f"sqlite:///{installed.workdir / 'store.db'}"
    result = _run([installed.python, "-I", script, ROOT, url], installed)
    assert result.stdout.strip() == f"ok {_newest_revision()}"
