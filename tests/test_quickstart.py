"""docs/quickstart.md, pasted into a shell step by step, in a fresh home directory.

The steps are the page's ```` ```shell ```` blocks, run in order as one shell session
would run them: each block in a bash of its own that starts from the environment and
the directory the previous block left (``export -p`` and ``$PWD`` carried over), and
fails on the first command that fails. MyST comments on the page steer the run:

- ``% quickstart: skip <reason>`` right before a block: not run. Only the install
  step is skipped: the test installs streamkit into ``~/streamkit-env`` itself, as
  ``pip install /path/to/streamkit`` would (see :func:`install_streamkit`), and starts
  the session with that environment activated, as the skipped block does;
- ``% quickstart: background`` right before a block: started in the background in a
  session of its own (a worker in its own terminal), its output kept;
- ``% quickstart: output ...`` right before a ``text`` block: each of its lines
  appears in the background processes' output (waited for);
- ``% quickstart: ctrl-c``: SIGINT to each background process's group, as Ctrl-C in
  its terminal sends; each must exit with status 0.

The page's Redis port (6390) is replaced by a free one, so that the run never meets
a server of someone else's. ``PYTHONUNBUFFERED=1`` makes a worker's prints appear
as they happen, as they do in a terminal. Nothing of the repository (``examples``,
``tests``) is importable and its directory is never the current one: the steps must
work with what they create themselves.

Run it by hand with ``pytest tests/test_quickstart.py -s`` to see every step's output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import NamedTuple

import attrs
import trio

from streamkit.testing import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
README = ROOT / "README.md"
PAGE_PORT = "6390"
MARKER = re.compile(r"^%\s*quickstart:\s*(?P<kind>[\w-]+)\s*(?P<rest>.*)$")
FENCE = re.compile(r"^(?P<fence>`{3,})\s*(?P<info>\S*)\s*$")
STEP_TIMEOUT = 30.0
TOTAL_TIMEOUT = 90.0


class Step(NamedTuple):
    """One step of the page: what to do, the page line it starts on, its text."""

    kind: str  # run, skip, background, output, ctrl-c
    line: int
    source: str


def fenced_blocks(text: str) -> list[tuple[int, str, str, str]]:
    """(first code line, language, source, marker line before it or "") per block."""
    lines = text.splitlines()
    found = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != match["fence"]:
            end += 1
        before = lines[index - 1].strip() if index else ""
        source = "\n".join(lines[index + 1 : end]) + "\n"
        found.append((index + 2, match["info"], source, before))
        index = end + 1
    return found


def steps(text: str) -> list[Step]:
    """The page's steps, in order."""
    blocks = {
        line - 1: (language, source, before)
        for line, language, source, before in fenced_blocks(text)
    }
    result: list[Step] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        marker = MARKER.match(line.strip())
        if marker is not None and marker["kind"] == "ctrl-c":
            result.append(Step("ctrl-c", number, ""))
        if number not in blocks:
            continue
        language, source, before = blocks[number]
        marked = MARKER.match(before)
        kind = marked["kind"] if marked else "run"
        if language == "shell":
            assert kind in ("run", "skip", "background"), f"line {number}: {kind} on a shell block"
            if kind == "skip":
                assert len(marked["rest"] if marked else "") >= 10, f"line {number}: say why"
            result.append(Step(kind, number + 1, source))
        elif language == "text" and kind == "output":
            result.append(Step("output", number + 1, source))
        else:
            raise AssertionError(
                f"line {number}: a ```{language} block is not a step the test runs"
            )
    return result


def install_streamkit(env_dir: Path, site: Path) -> None:
    """A virtual environment with streamkit installed, as ``pip install CHECKOUT`` makes.

    Importable: the ``streamkit`` package of this checkout (``site`` holds a link to
    it) and the running environment's installed packages, its dependencies; not the
    repository's other directories. The ``streamkit`` command is the project's entry
    point.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site.mkdir()
    (site / "streamkit").symlink_to(ROOT / "streamkit")
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    found = subprocess.run(
        [env_dir / "bin" / "python", "-c", where], check=True, capture_output=True, text=True
    )
    purelib = found.stdout.strip()
    # Path lines of a .pth file are added to sys.path; the .pth files in those paths
    # are not read, so the running environment's editable install of the whole
    # repository does not come along.
    (Path(purelib) / "streamkit-quickstart.pth").write_text(
        f"{site}\n{sysconfig.get_paths()['purelib']}\n", encoding="utf-8"
    )
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    module, function = scripts["streamkit"].split(":")
    command = env_dir / "bin" / "streamkit"
    command.write_text(
        f"#!{env_dir / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\n"
        f"sys.exit({function}())\n",
        encoding="utf-8",
    )
    command.chmod(0o755)


@attrs.define(eq=False)
class Session:
    """The shell session the steps run in: environment, directory, background jobs."""

    home: Path
    state: Path
    env: dict[str, str]
    logs: Path
    background: list[tuple[trio.Process, Path]] = attrs.field(factory=list)

    def script(self, source: str) -> str:
        return f". {self.state}\n{source}"

    async def run(self, step: Step) -> str:
        # A new file per step: a background process started before may still be
        # reading the previous one.
        after = self.state.with_name(f"shell-state-{step.line}")
        save = f'{{ export -p; printf "cd %q\\n" "$PWD"; }} > {after}'
        script = f"set -eo pipefail\n{self.script(step.source)}\n{save}\n"
        with trio.fail_after(STEP_TIMEOUT):
            result = await trio.run_process(
                ["bash", "-c", script],
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        out = result.stdout.decode() + result.stderr.decode()
        print(f"--- quickstart.md:{step.line}\n{step.source}{out}")
        assert result.returncode == 0, (
            f"the step at quickstart.md:{step.line} failed:\n{step.source}\n{out}"
        )
        self.state = after
        return out

    async def start(self, step: Step) -> None:
        log = self.logs / f"background-{len(self.background) + 1}.log"
        with log.open("wb") as output:
            process = await trio.lowlevel.open_process(
                ["bash", "-c", f"{self.script('exec ' + step.source.strip())}"],
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((process, log))

    async def wait_output(self, step: Step) -> None:
        """Wait until every line of ``step`` is a line of the background output."""
        expected = step.source.splitlines()

        def shown() -> bool:
            for process, _ in self.background:
                assert process.returncode is None, (
                    f"exited ({process.returncode}):\n{self.output()}"
                )
            lines = self.output().splitlines()
            return all(line in lines for line in expected)

        try:
            await wait_until(shown, what=f"the output at quickstart.md:{step.line}", within=30)
        except trio.TooSlowError as exc:
            raise AssertionError(f"{exc}; the output so far:\n{self.output()}") from None

    def output(self) -> str:
        return "".join(
            log.read_text(encoding="utf-8", errors="replace") for _, log in self.background
        )

    async def ctrl_c(self) -> None:
        for process, log in self.background:
            os.killpg(process.pid, signal.SIGINT)
            with trio.fail_after(STEP_TIMEOUT):
                code = await process.wait()
            text = log.read_text(encoding="utf-8", errors="replace")
            print(f"--- after Ctrl-C, exit status {code}:\n{text}")
            assert code == 0, f"exit status {code} after Ctrl-C:\n{text}"
        self.background.clear()

    def kill_all(self) -> None:
        for process, _ in self.background:
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)


async def test_the_quickstart_works_pasted_into_a_shell(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert f"--port {PAGE_PORT}" in text
    port = str(free_port())
    page_steps = [s._replace(source=s.source.replace(PAGE_PORT, port)) for s in steps(text)]
    # The system packages (root and the network) and the install (done above).
    assert [s.kind for s in page_steps].count("skip") == 2

    home = tmp_path / "home"
    home.mkdir()
    await trio.to_thread.run_sync(
        install_streamkit, home / "streamkit-env", tmp_path / "site-packages"
    )
    state = tmp_path / "shell-state"
    # The skipped install step ends with the environment activated.
    state.write_text('cd "$HOME"\n. ~/streamkit-env/bin/activate\n', encoding="utf-8")
    env = {
        "HOME": str(home),
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    session = Session(home, state, env, tmp_path)
    outputs: dict[str, str] = {}
    try:
        with trio.fail_after(TOTAL_TIMEOUT):
            for step in page_steps:
                if step.kind == "run":
                    outputs[step.source] = await session.run(step)
                    if step.source.startswith("redis-server "):
                        await the_server_keeps_nothing_in_place(port)
                elif step.kind == "background":
                    await session.start(step)
                elif step.kind == "output":
                    await session.wait_output(step)
                elif step.kind == "ctrl-c":
                    await session.ctrl_c()
    finally:
        session.kill_all()
        # The page starts a daemonized server: stop it whatever happened.
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await trio.run_process(
                ["redis-cli", "-p", port, "shutdown", "nosave"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    [status] = [out for source, out in outputs.items() if source.startswith("streamkit status")]
    assert "printer" in status
    assert not session.background, "the page leaves a background process running"
    # The server, stopped, left nothing behind: not its pid file, no data.
    assert not await trio.Path(f"/tmp/redis-{port}.pid").exists()
    assert not [p.name for p in home.rglob("*") if p.suffix in (".rdb", ".aof")]


async def the_server_keeps_nothing_in_place(port: str) -> None:
    """The page's Redis writes no data, and its pid file (which a daemonized server
    writes, to /var/run/redis.pid unless told) goes to /tmp, where the page says."""

    async def answers() -> bool:
        # ``--daemonize yes`` returns once the server has forked, maybe before it listens.
        done = await trio.run_process(
            ["redis-cli", "-p", port, "ping"], capture_stdout=True, capture_stderr=True, check=False
        )
        return done.returncode == 0 and done.stdout.strip() == b"PONG"

    await wait_until(answers, what=f"the page's Redis answering on port {port}", within=10)
    config = {}
    for name in ("pidfile", "save", "appendonly"):
        done = await trio.run_process(
            ["redis-cli", "-p", port, "config", "get", name], capture_stdout=True, check=True
        )
        config[name] = done.stdout.decode().splitlines()[1:2]
    assert config == {
        "pidfile": [f"/tmp/redis-{port}.pid"],
        "save": [""],
        "appendonly": ["no"],
    }, config
    assert await trio.Path(f"/tmp/redis-{port}.pid").exists()


def shell_blocks(text: str) -> list[str]:
    return [source for _, language, source, _ in fenced_blocks(text) if language == "shell"]


def test_the_readme_quickstart_is_the_same() -> None:
    readme = README.read_text(encoding="utf-8")
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    assert shell_blocks(section) == shell_blocks(PAGE.read_text(encoding="utf-8"))


def test_no_page_installs_someone_elses_package() -> None:
    """``streamkit`` on the package index is an unrelated project: no command installs it."""
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for line, _, source, _ in fenced_blocks(page.read_text(encoding="utf-8")):
            for offset, command in enumerate(source.splitlines()):
                found = re.search(r"pip\s+install\s+[\"']?streamkit\b", command)
                assert found is None, f"{page.name}:{line + offset}: {command.strip()}"


def test_no_step_needs_sudo() -> None:
    """A root shell or a container has no ``sudo``: no step, not even a skipped one,
    calls it (the test runs the others as whoever runs the tests, root here)."""
    readme = README.read_text(encoding="utf-8").split("\n## Quickstart\n", 1)[1]
    for name, text in (
        ("README.md", readme.split("\n## ", 1)[0]),
        ("quickstart.md", PAGE.read_text(encoding="utf-8")),
    ):
        for source in shell_blocks(text):
            for command in source.splitlines():
                code = command.split("#", 1)[0]
                assert not re.search(r"(^|[;&|]\s*)sudo\b", code.strip()), f"{name}: {command}"


def test_the_readme_says_a_failure_halts_by_default_and_how_to_resume() -> None:
    """Where the README first speaks of a processor failing, it says the default (halt),
    how to see it and how to resume."""
    paragraphs = README.read_text(encoding="utf-8").split("\n\n")
    first = next(p for p in paragraphs if re.search(r"\b(raises|fails)\b", p))
    for said in ("default", "**halt**", "streamkit status shop:app", "HALTED", "streamkit resume"):
        assert said in first, (said, first)
