"""Project sessions. ``./dev`` prepares .venv and runs them inside it.

Sessions run in the current environment (no per-session virtualenvs), so that
``./dev`` installs dependencies once.
"""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "docs", "tests"]

SOURCES = ["streamkit", "tests", "examples", "noxfile.py"]
BENCHMARKS = ["bench_send.py", "bench_consume.py", "bench_rebalance.py", "bench_spark.py"]
BENCHMARK_TITLES = {
    "bench_send.py": "Sending",
    "bench_consume.py": "Consuming",
    "bench_rebalance.py": "Rebalancing",
    "bench_spark.py": "Spark",
}
BENCHMARK_NOTES = {
    "bench_send.py": (
        "`send_many` against a bare pipelined `XADD` loop of pre-encoded payloads on the "
        "same coredis client. For reference, runnel sends about 30k events/s on this kind "
        "of machine."
    ),
    "bench_consume.py": (
        "One worker (`run_worker`), one processor with a trivial body, against a bare "
        "coredis `XREADGROUP COUNT 500` + `XACK` loop on the same data. For reference, "
        "runnel processes about 3.9k events/s with `records()` and 6k with `take(500)` on "
        "this kind of machine."
    ),
    "bench_rebalance.py": (
        "Membership, locks and rebalancer with 16 partitions whose work ticks every 5 ms: "
        "how soon moved partitions resume on their new owner, and the longest pause of "
        "the partitions that do not move."
    ),
    "bench_spark.py": (
        "Spark batch write and read (local[2]) against a pipelined redis-py `XADD` loop "
        "and a redis-py `XRANGE` paging loop."
    ),
}
PERFORMANCE_INTRO = """
# Performance

This page is written by `./dev bench` (the nox `bench` session) from the output of
the benchmark scripts in `tests/benchmarks/`: the figures come from a run, not from a
hand. Each script measures streamkit side by side with the bare Redis loop it is
built on, in the same run, so the ratios hold even where the absolute numbers depend
on the machine (a busy machine moves both).
"""


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.run("ruff", "check", *SOURCES)
    session.run("ruff", "format", "--check", *SOURCES)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, tests and examples."""
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation; any warning fails the build."""
    session.run(
        "sphinx-build", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html"
    )


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, against private redis-server processes."""
    session.run("pytest", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: print figures and ratios measured side by side, and write
    docs/performance.md from this run's output."""
    outputs = {}
    for script in BENCHMARKS:
        output = session.run("python", f"tests/benchmarks/{script}", silent=True)
        assert isinstance(output, str)
        print(output)
        outputs[script] = output
    Path("docs/performance.md").write_text(performance_page(outputs))
    session.log("wrote docs/performance.md")


def performance_page(outputs: dict[str, str]) -> str:
    """The performance docs page: the benchmarks' own output from this run."""
    lines = [PERFORMANCE_INTRO.strip(), ""]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(
        f"Run on {now}: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()}."
    )
    for script, output in outputs.items():
        lines += ["", f"## {BENCHMARK_TITLES[script]}", "", BENCHMARK_NOTES[script], ""]
        kept = [line for line in output.splitlines() if not _noise(line)]
        lines += ["```text", *kept, "```"]
    return "\n".join(lines) + "\n"


def _noise(line: str) -> bool:
    # Spark's own start-up chatter and progress bars are not figures.
    return (
        not line.strip()
        or line.startswith(("Using Spark", "Setting default log", "To adjust logging", "WARNING:"))
        or " WARN " in line
        or "[Stage" in line
    )


@nox.session
def reliability(session: nox.Session) -> None:
    """Fault-injection suite; writes docs/reliability.md from this run's figures."""
    report = Path(session.create_tmp()) / "reliability.jsonl"
    report.unlink(missing_ok=True)
    session.run(
        "pytest",
        "tests/reliability",
        "-p",
        "no:randomly",
        *session.posargs,
        env={"STREAMKIT_RELIABILITY_REPORT": str(report)},
    )
    session.run("python", "tests/reliability/write_report.py", str(report))


@nox.session
def demo(session: nox.Session) -> None:
    """The orders demo on a private, throwaway Redis server."""
    session.run("python", "-m", "examples.orders.demo", *session.posargs)
