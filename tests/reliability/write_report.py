"""Turn the reliability suite's JSON-lines reports into ``docs/reliability.md``.

Usage (what ``nox -s reliability`` runs after the suite)::

    STREAMKIT_RELIABILITY_REPORT=reliability.jsonl pytest tests/reliability -p no:randomly
    python tests/reliability/write_report.py reliability.jsonl [docs/reliability.md]

The figures on the page come from that run only; nothing on it is typed by hand.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = ROOT / "docs" / "reliability.md"
REPORT_ENV = "STREAMKIT_RELIABILITY_REPORT"

# The order: kill, pause, restart, unreachable, churn, bad input, keys, trimming.
ORDER = (
    "kill-9",
    "sigstop",
    "redis-restart",
    "redis-down-at-start",
    "redis-never-up",
    "churn",
    "bad-input",
    "deleted-keys",
    "trimming",
    "net-blackhole",
    "net-one-way",
    "net-latency",
    "net-resets",
    "net-clients",
)

INTRO = """\
# Reliability

streamkit's fault-injection suite (`tests/reliability/`) runs real `redis-server` and
real `streamkit worker` processes, injects the faults users hit in production, and
counts every event. Each event carries a unique id (a key and a per-key sequence
number) and every processing of it is recorded in Redis, so each scenario reports:

- **sent**: events sent (and acknowledged by Redis) during the scenario;
- **processed**: processings recorded, repeats included;
- **lost**: events sent and never processed; the suite fails unless it is 0;
- **duplicated**: repeated processings (at-least-once delivery); the suite fails
  unless they stay within the bound shown, which is what was in flight: the entries
  the faulted worker had been handed and had not acknowledged, read from Redis right
  after the fault, or `partitions x prefetch x batch_size` where that cannot be read;
- **order violations**: events processed for the first time before an earlier event
  of their key; the suite fails unless it is 0;
- **recovery**: how long the fault held processing up; each scenario defines it below;
- **job runs / run again (bound)**, in the scenarios that run jobs too: runs of the
  jobs' functions, and the jobs that ran more than once; the suite fails unless every
  job succeeded and those run again are among the bound shown, the jobs running on a
  worker when it was cut off (and were run again only after their lease lapsed).

Workers run with short timings so that the suite takes a few minutes: `lease_ttl`
1.5 s, `heartbeat_interval` 0.1 s, `session_timeout` 1.5 s, `grace_period` 2 s. Recovery
times scale with `lease_ttl` and `session_timeout`: a worker that dies holds its
partitions until both have passed.

This page is generated from an actual run by `nox -s reliability` (the figures come
from that run, not from a hand); run it again to refresh them.

## Network faults

The scenarios whose names start with `net-` (`tests/reliability/test_network.py`) put
each worker behind a fault proxy of its own (`tests/netfaults.py`, a small TCP proxy on
the loopback) in front of the real `redis-server`, while the producer and the checks
talk to Redis directly and never pause. The workers run `tests.apps.stateful:app`: two
tables, a windowed table and an output stream, all committed with the
acknowledgements, so a commit that landed from a worker whose lease had lapsed would
count its events twice. After each scenario every count, sum, window result and echo
equals what was sent (each once, in send order per key).

In the blackhole and latency scenarios the workers run `tests.apps.netjobs:app`, the
same processor beside a job of 0.3 s, and jobs are enqueued throughout as well (25 a
second, directly). Each run of a job records its start and end on the server itself,
not through its worker's link, so a run on a worker cut off from Redis is counted
too: the reports give the jobs enqueued, their runs and the jobs run again, against
what the job leases allow (a job may run again only if its worker was cut off while
running it, and only once that run's lease lapsed). Every job must end in success.

- **A worker blackholed both ways past its lease** proves fencing across a network
  partition: the others take its partitions over once its lease and its session ran
  out, nothing it sends is heard, and it rejoins when the link heals. Its jobs are
  fenced the same way: it is cut off in the middle of a run, and that job, and only a
  job it was running at the cut, runs once more on another worker, started no sooner
  than a job lease after the cut worker's last renewal could have landed; the success
  recorded is the other worker's, the cut-off worker's finish is refused when the
  link heals (it logs that the job was taken over), no outcome of its lands during
  the fault, and it runs jobs again after the heal.
- **A worker's replies blackholed** (its requests still reach Redis) proves that a
  worker cut off one way lets go: a member that has heard nothing from Redis for its
  session timeout stops heartbeating (it only pings), so the others reap it, and a
  lease loop that has heard nothing for a lease period stops sending acquire attempts
  (it only asks who holds the lock), so attempts nobody hears cannot re-take its
  partitions with new tokens. Checked from Redis: its heartbeat key stays gone after
  the one in flight at the cut, it never holds a lease with a new token during the
  fault, and the others hold all its partitions within the lease plus the session
  timeout on an idle machine (the recovery figure; the test allows twice that, for
  the others' lock polls and reaper on a loaded one). Before the fix its heartbeat
  landed again every session timeout and the takeover could wait for good. Its jobs
  under way at the cut still end in success, recorded from it (its requests reach
  Redis), and none runs again.
- **50 ms round trips with 20 ms of jitter on every link** prove that latency alone
  costs no lease and no membership: no lease changes hands and no member leaves while
  it lasts; the figure is how long after the last send every event was counted. No job
  is taken over from the worker running it: each runs once, on its first try, and
  succeeds.
- **Connections reset mid-reply at random on every link** check that a reply cut
  short is an unknown outcome handled as such: nothing lost, counted twice or
  reordered. A commit lost with its connection stops its partition, and the partition
  then commits and acknowledges nothing more: what the worker did since builds on the
  lost commit's writes (a table's cache holds them as committed), so only a new start
  from what Redis holds is exact. Until that was so, the minute-long soak counted a few
  keys once too many or once too few in about a third of its runs (a commit queued
  behind the lost one, or the lost one's events acknowledged without their writes, went
  out as the partition was left); `tests/test_state.py` has both cases, a commit sent
  into a blackhole and then cut. Likewise a settling round of the windows cut short
  (a window closed, the next one's read lost) leaves nothing to commit: its closed
  windows' results went with the error, and the commit made as the partition was left
  deleted such a window's values without its result (a harsher soak lost one window).
  `STREAMKIT_NET_RESET_PROBABILITY` (0.01 by default) makes the soak harsher.

- **The blocking and asyncio clients through blackholes and resets** prove the
  clients' promise: a record whose `send` returned landed once (appends carry an
  idempotency marker and are retried with it), one told
  [`OutcomeUnknown`](clients.md) (its replies lost for longer than a send retries)
  landed once or not at all, one told `RedisUnavailable` never; a job enqueued again
  with its `job_id` after a failure is queued once.

The short forms run in `./dev test`; `./dev nox -s netsoak` runs them all with the
latency and reset faults lasting a minute each (`STREAMKIT_NET_SOAK=60`) and prints
their reports.
"""


def _order(report: dict[str, Any]) -> tuple[int, str]:
    scenario: str = report["scenario"]
    for index, prefix in enumerate(ORDER):
        if scenario == prefix or scenario.startswith(prefix + ":"):
            return index, scenario
    return len(ORDER), scenario


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _duplicates(report: dict[str, Any]) -> str:
    bound = report["duplicate_bound"]
    return f"{report['duplicated']}" if bound is None else f"{report['duplicated']} (≤ {bound})"


def _jobs(report: dict[str, Any]) -> str:
    """The jobs' figures of a scenario that ran jobs: runs, reruns (bound)."""
    if report.get("jobs") is None:
        return "n/a"
    return f"{report['job_runs']} / {report['job_reruns']} (≤ {report['job_rerun_bound']})"


def _jobs_sentence(report: dict[str, Any]) -> str:
    if report.get("jobs") is None:
        return ""
    return (
        f" {report['jobs']} jobs enqueued ({report['jobs_per_second']:.0f}/s), "
        f"{report['job_runs']} runs, {report['job_reruns']} run again "
        f"(≤ {report['job_rerun_bound']}, the jobs the cut-off worker ran around the cut)."
    )


def render(reports: list[dict[str, Any]]) -> str:
    """The Markdown page for ``reports`` (one per scenario; the last one wins)."""
    latest: dict[str, dict[str, Any]] = {}
    for report in reports:
        latest[report["scenario"]] = report
    ordered = sorted(latest.values(), key=_order)
    if not ordered:
        raise SystemExit("no scenario reports to write")
    lines = [INTRO]
    dates = sorted(r["recorded_at"] for r in ordered)
    machines = sorted({r["machine"] for r in ordered})
    total = sum(r["duration_seconds"] for r in ordered)
    lines.append("## The last run\n")
    lines.append(
        f"Run from {dates[0]} to {dates[-1]} on {', '.join(machines)}; the scenarios "
        f"took {total:.0f} s in all.\n"
    )
    lines.append(
        "| scenario | events sent | processed | lost | duplicated (bound) "
        "| order violations | recovery | job runs / run again (bound) |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines.extend(
        f"| {_cell(r['title'])} | {r['sent']} | {r['processed']} | {r['lost']} "
        f"| {_duplicates(r)} | {r['order_violations']} "
        f"| {_seconds(r['recovery_seconds'])} | {_jobs(r)} |"
        for r in ordered
    )
    lines.append("\n## Scenarios\n")
    for r in ordered:
        lines.append(f"### {r['title']}\n")
        recovery = (
            f"Recovery, {r['recovery']}: **{_seconds(r['recovery_seconds'])}**."
            if r["recovery_seconds"] is not None
            else f"Recovery: {r['recovery']}."
        )
        lines.append(
            f"Injected: {r['injected']}. {r['sent']} events sent, {r['processed']} "
            f"processings, {r['lost']} lost, {_duplicates(r)} duplicated, "
            f"{r['order_violations']} order violations.{_jobs_sentence(r)} {recovery} "
            f"{r['notes'][:1].upper() + r['notes'][1:]}. "
            f"(Scenario `{r['scenario']}`, {r['duration_seconds']:.1f} s.)\n"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    source = argv[1] if len(argv) > 1 else os.environ.get(REPORT_ENV)
    if not source:
        raise SystemExit(f"usage: {argv[0]} REPORT.jsonl [OUTPUT.md] (or set {REPORT_ENV})")
    output = Path(argv[2]) if len(argv) > 2 else DEFAULT_OUTPUT
    text = Path(source).read_text(encoding="utf-8")
    reports = [json.loads(line) for line in text.splitlines() if line.strip()]
    output.write_text(render(reports), encoding="utf-8")
    print(f"wrote {output} ({len({r['scenario'] for r in reports})} scenarios)")


if __name__ == "__main__":
    main(sys.argv)
