"""What a new user meets first: the quickstart, its pasted hints, the install section, the picture.

The commands the demo prints must run when pasted into a shell where ``agentsnap`` is not on
the ``PATH`` (right after ``make demo``) as well as where it is; the timeline picture in the
README and on the documentation's home page must be what the renderer draws from the demo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import click
import pytest

from agentsnap._hints import cli_command, cli_words
from agentsnap.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS_HOME = ROOT / "docs" / "index.md"
PICTURE = ROOT / "docs" / "assets" / "timeline.svg"
SVG = "{http://www.w3.org/2000/svg}"
TIMEOUT = 120


def _script() -> Path:
    """This installation's ``agentsnap`` script (the one ``make demo`` runs)."""
    folder = Path(sysconfig.get_path("scripts"))
    script = folder / "agentsnap"
    if not script.is_file():
        pytest.skip(f"agentsnap is not installed as a script in {folder}")
    return script


def _env(path: list[str]) -> dict[str, str]:
    """A user's shell: this ``PATH``, no database chosen by the environment."""
    env = {k: v for k, v in os.environ.items() if k not in {"AGENTSNAP_DB", "VIRTUAL_ENV"}}
    env["PATH"] = os.pathsep.join(path)
    return env


def _path_without(folder: Path) -> list[str]:
    return [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != folder.resolve()
    ]


def _run_demo(script: Path, cwd: Path, env: dict[str, str], *args: str) -> list[str]:
    """Run ``agentsnap demo`` as ``make demo`` does; return the commands it suggests."""
    done = subprocess.run(
        [str(script), "demo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.endswith("look at it with:")]
    hints = [line.strip() for line in lines[start + 1 :] if line.startswith("  ")]
    assert len(hints) == 4, done.stdout
    return hints


def _paste(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` through a shell, as a user pasting it would."""
    return subprocess.run(
        command,
        shell=True,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


# --- The demo's hints work when pasted -----------------------------------------------------


@pytest.mark.parametrize("on_path", [False, True], ids=["agentsnap-off-PATH", "agentsnap-on-PATH"])
def test_the_demos_hints_run_when_pasted(on_path: bool, tmp_path: Path) -> None:
    script = _script()
    rest = _path_without(script.parent)
    env = _env([str(script.parent), *rest] if on_path else rest)

    hints = _run_demo(script, tmp_path, env)

    first = shlex.split(hints[0])[0]
    assert first == ("agentsnap" if on_path else str(script))
    rollbacks, timeline, export, inspector = hints
    assert shlex.split(rollbacks)[1] == "rollbacks"
    done = _paste(rollbacks, tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "the draft cites no sources" in done.stdout

    done = _paste(timeline, tmp_path, env)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "timeline.html").read_text(encoding="utf-8")
    assert 'id="agentsnap-data"' in page, "the page carries the run's data"
    assert "researcher" in page

    done = _paste(export, tmp_path, env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["run"]["status"] == "succeeded"
    assert shlex.split(export)[2] == document["run"]["id"]

    # The inspector serves until Ctrl-C: its help shows that the pasted command starts.
    assert shlex.split(inspector)[1] == "ui"
    done = _paste(f"{inspector} --help", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "web inspector" in done.stdout


def test_from_the_checkout_the_hints_name_the_script_relative_to_it(tmp_path: Path) -> None:
    script = _script()
    if not script.is_relative_to(ROOT):
        pytest.skip(f"the environment ({script.parent}) is not inside the checkout")
    env = _env(_path_without(script.parent))
    db = f"sqlite:///{tmp_path / 'agentsnap.db'}"

    hints = _run_demo(script, ROOT, env, "--db", db)

    relative = str(script.relative_to(ROOT))  # .venv/bin/agentsnap after make demo
    assert all(shlex.split(hint)[0] == relative for hint in hints), hints
    rollbacks, _, export, _ = hints  # the timeline would be written into the checkout
    assert _paste(rollbacks, ROOT, env).returncode == 0
    done = _paste(export, ROOT, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rollbacks"][0]["agent"] == "writer"


# --- How a command is named ----------------------------------------------------------------


def _fake_script(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "agentsnap"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def test_a_script_under_the_current_directory_is_named_relative_to_it(tmp_path: Path) -> None:
    scripts = _fake_script(tmp_path / ".venv" / "bin").parent
    empty = str(tmp_path / "empty")

    assert cli_words(search_path=empty, cwd=tmp_path, scripts=[scripts]) == [
        os.path.join(".venv", "bin", "agentsnap")
    ]
    # In the scripts folder itself a bare name would be looked up on PATH: ./agentsnap.
    assert cli_words(search_path=empty, cwd=scripts, scripts=[scripts]) == [
        os.path.join(".", "agentsnap")
    ]
    elsewhere = tmp_path / "elsewhere"
    assert cli_words(search_path=empty, cwd=elsewhere, scripts=[scripts]) == [
        str(scripts / "agentsnap")
    ]


def test_the_bare_name_is_used_when_path_finds_this_installation(tmp_path: Path) -> None:
    scripts = _fake_script(tmp_path / "venv" / "bin").parent

    assert cli_words(search_path=str(scripts), cwd=tmp_path, scripts=[scripts]) == ["agentsnap"]
    # Another agentsnap first on PATH would not be this one: name this one by its path.
    other = _fake_script(tmp_path / "other").parent
    assert cli_words(search_path=str(other), cwd=tmp_path, scripts=[scripts]) == [
        os.path.join("venv", "bin", "agentsnap")
    ]
    # No script of its own (a source tree): whatever PATH finds.
    assert cli_words(search_path=str(other), cwd=tmp_path, scripts=[]) == ["agentsnap"]


def test_without_any_script_the_interpreter_runs_the_package(tmp_path: Path) -> None:
    words = cli_words(search_path=str(tmp_path), cwd=tmp_path, scripts=[])

    assert words[1:] == ["-m", "agentsnap"]
    done = subprocess.run(
        [*words, "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("agentsnap, version ")


def test_arguments_are_quoted_for_the_shell() -> None:
    url = "postgresql://app:secret@localhost:5432/agentsnap?sslmode=require&x=1"

    command = cli_command("export", "3fa2", "--db", url)

    assert shlex.split(command)[-4:] == ["export", "3fa2", "--db", url]


# --- The timeline picture ------------------------------------------------------------------


def _demo_timeline() -> ModuleType:
    """``scripts/demo_timeline.py``, the script that draws the picture."""
    spec = importlib.util.spec_from_file_location(
        "demo_timeline", ROOT / "scripts" / "demo_timeline.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _texts(root: ET.Element, cls: str) -> list[str]:
    return [el.text or "" for el in root.iter(f"{SVG}text") if el.get("class") == cls]


def test_the_picture_is_a_well_formed_svg_of_the_demo() -> None:
    root = ET.fromstring(PICTURE.read_text(encoding="utf-8"))

    assert root.tag == f"{SVG}svg"
    width, height = int(root.get("width", "0")), int(root.get("height", "0"))
    assert width > 0
    assert height > 0
    assert root.get("viewBox") == f"0 0 {width} {height}"
    assert width <= 800, "wider, the picture would be shrunk to fit a page and hard to read"
    assert _texts(root, "agent") == ["$env", "planner", "researcher", "writer", "critic"]
    assert _texts(root, "cutlabel")[:2] == ["S1", "S2"]
    (rollback,) = _texts(root, "rblabel")
    assert rollback.startswith("rollback → S2: the draft cites no sources")
    assert _texts(root, "title")[0].endswith("(succeeded)")
    assert len([g for g in root.iter(f"{SVG}g") if g.get("class") == "msg"]) >= 5


async def test_the_picture_is_what_the_renderer_draws_from_the_demo_now() -> None:
    script = _demo_timeline()

    fresh = await script.draw()

    assert script.outline(PICTURE.read_text(encoding="utf-8")) == script.outline(fresh), (
        "docs/assets/timeline.svg is out of date: run python scripts/demo_timeline.py"
    )


def test_the_script_writes_and_checks_a_picture(tmp_path: Path) -> None:
    output = tmp_path / "timeline.svg"
    script = ROOT / "scripts" / "demo_timeline.py"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    written = run("-o", str(output))
    assert written.returncode == 0, written.stderr
    assert run("--check", "-o", str(output)).returncode == 0
    output.write_text(output.read_text(encoding="utf-8").replace(">S2<", ">S3<"), "utf-8")
    stale = run("--check", "-o", str(output))
    assert stale.returncode == 1
    assert "run python scripts/demo_timeline.py" in stale.stderr


@pytest.mark.parametrize(
    ("page", "link"), [(README, "docs/assets/timeline.svg"), (DOCS_HOME, "assets/timeline.svg")]
)
def test_the_readme_and_the_docs_home_show_the_picture(page: Path, link: str) -> None:
    assert re.search(rf"!\[[^\]]+\]\({re.escape(link)}\)", page.read_text(encoding="utf-8"))
    assert (page.parent / link).resolve() == PICTURE


# --- The README's commands -----------------------------------------------------------------


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_quickstart_is_two_make_targets_that_exist() -> None:
    quickstart = _section(README.read_text(encoding="utf-8"), "Quickstart")
    (block,) = re.findall(r"```bash\n(.*?)```", quickstart, re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]

    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)


def test_the_install_section_names_every_extra_and_the_wheel_that_is_built() -> None:
    install = _section(README.read_text(encoding="utf-8"), "Install")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

    extras = set(re.findall(r"^\| `([a-z][a-z-]*)` \|", install, re.M))
    assert extras == set(pyproject["project"]["optional-dependencies"])
    version = pyproject["project"]["version"]
    assert f"dist/agentsnap-{version}-py3-none-any.whl" in install


def _documented_commands() -> list[tuple[str, list[str]]]:
    """Every ``agentsnap ...`` line of a shell block in the README and the docs."""
    found: list[tuple[str, list[str]]] = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.splitlines():
                words = shlex.split(line.split(" #")[0])
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words and Path(words[0]).name == "agentsnap":
                    found.append((f"{page.relative_to(ROOT)}: {line.strip()}", words[1:]))
    return found


COMMANDS = _documented_commands()


@pytest.mark.parametrize(
    ("where", "args"),
    COMMANDS,
    ids=[f"{where.split(':')[0]}-{' '.join(args[:2])}" for where, args in COMMANDS],
)
def test_every_documented_command_parses(where: str, args: list[str]) -> None:
    assert args, where
    command = main.commands.get(args[0])
    assert command is not None, f"{where}: no command {args[0]!r}"
    # Placeholders (RUN, SNAPSHOT) stand for arguments; [--agent writer] is optional.
    rest = [word.strip("[]") for word in args[1:]]
    if isinstance(command, click.Group):
        if rest and rest[0] in command.commands:
            command, rest = command.commands[rest[0]], rest[1:]
        elif args[0] == "tools":  # `tools RUN` is the ledger of a run
            return
        elif not command.invoke_without_command:
            pytest.fail(f"{where}: no command {' '.join(args[:2])!r}")
    try:
        command.make_context(args[0], rest)
    except click.ClickException as exc:
        pytest.fail(f"{where}: {exc.format_message()}")
