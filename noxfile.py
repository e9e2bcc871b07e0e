"""Project sessions. ``./dev`` prepares .venv and runs them inside it.

Sessions run in the current environment (no per-session virtualenvs), so that
``./dev`` installs dependencies once.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "docs", "tests"]

SOURCES = ["streamkit", "tests", "examples", "noxfile.py"]
BENCHMARKS = ["bench_send.py", "bench_consume.py", "bench_rebalance.py", "bench_spark.py"]


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
    """Benchmarks: print throughput figures and ratios measured side by side."""
    for script in BENCHMARKS:
        session.run("python", f"tests/benchmarks/{script}", *session.posargs)


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
