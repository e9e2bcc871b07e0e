"""The job queue's replies decoded, pure: statuses, job records, results and aborts.

Every client of a queue (the Trio :class:`~streamkit.jobs.JobQueue` and the blocking
and asyncio clients of :mod:`streamkit.clients`) reads what the queue's scripts and
keys return through these functions, so they all mean the same by a reply.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs
import orjson

from .._errors import ConfigError, JobFailed, JobNotFound, ResultNotKept
from .._wire import text
from ._model import JobChunk, JobErrorInfo, JobEvent, JobInfo, JobStatus, JobTry, Priority

__all__ = [
    "abort_reply",
    "decode_events",
    "decode_history",
    "decode_info",
    "decode_output",
    "event_cursors",
    "events_after",
    "info_reply",
    "outcome",
    "progress_value",
    "status_reply",
    "watch_reply",
]

_PRIORITY_NAMES: tuple[Priority, ...] = ("high", "normal", "low")


def _time(value: bytes | None) -> datetime | None:
    if not value or value == b"0":
        return None
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def _error(value: bytes | None) -> JobErrorInfo | None:
    if not value:
        return None
    data = orjson.loads(value)
    return JobErrorInfo(data.get("type", "?"), data.get("message", ""), data.get("traceback", ""))


def _headers(value: bytes | None) -> dict[str, str]:
    if not value:
        return {}
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in decoded.items()} if isinstance(decoded, dict) else {}


def decode_history(value: bytes | None) -> tuple[JobTry, ...]:
    """The tries in a job's ``hist`` field (see :mod:`streamkit.jobs._scripts`)."""
    tries: list[JobTry] = []
    for line in text(value or b"").splitlines():
        kind, _, rest = line.partition(",")
        parts = rest.split(",", 3)
        try:
            number, moment = int(parts[0]), _time(parts[1].encode())
        except (IndexError, ValueError):
            continue  # a line cut by the size limit, or unknown
        if kind == "s":
            worker = parts[2] if len(parts) > 2 else None
            tries.append(JobTry(number=number, started_at=moment, worker=worker))
        elif kind == "e" and len(parts) > 2:
            outcome, error_type = parts[2], parts[3] if len(parts) > 3 else None
            if tries and tries[-1].outcome is None and tries[-1].number == number:
                tries[-1] = attrs.evolve(
                    tries[-1], ended_at=moment, outcome=outcome, error_type=error_type
                )
            else:  # its start was cut off by the size limit
                tries.append(
                    JobTry(
                        number=number,
                        started_at=None,
                        worker=None,
                        ended_at=moment,
                        outcome=outcome,
                        error_type=error_type,
                    )
                )
    return tuple(tries)


def decode_info(queue: str, job_id: str, fields: dict[bytes, bytes]) -> JobInfo:
    """A :class:`JobInfo` from a job's hash."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    raw_args = fields.get(b"args")
    if raw_args:
        try:
            args, kwargs = orjson.loads(raw_args)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            args, kwargs = [text(raw_args)], {}
    progress = fields.get(b"progress")
    fraction, message = orjson.loads(progress) if progress else (None, None)
    worker = fields.get(b"worker")
    return JobInfo(
        id=job_id,
        queue=queue,
        name=text(fields.get(b"name", b"?")),
        status=JobStatus(text(fields[b"status"])),
        args=tuple(args),
        kwargs=kwargs,
        priority=_PRIORITY_NAMES[int(fields.get(b"prio", b"1"))],
        tries=int(fields.get(b"tries", b"0")),
        max_tries=int(fields.get(b"max_tries", b"1")),
        enqueued_at=_time(fields.get(b"enqueued")),
        due_at=_time(fields.get(b"due")),
        started_at=_time(fields.get(b"started")),
        finished_at=_time(fields.get(b"finished")),
        expires_at=_time(fields.get(b"expires")),
        worker=text(worker) if worker else None,
        error=_error(fields.get(b"error")),
        progress=fraction,
        progress_message=message,
        lost=int(fields.get(b"lost", b"0")),
        history=decode_history(fields.get(b"hist")),
        held_by=text(fields[b"held"]) if fields.get(b"held") else None,
        limit_key=text(fields[b"lk"]) if fields.get(b"lk") else None,
        headers=_headers(fields.get(b"hdr")),
        progress_value=progress_value(fields.get(b"pv")),
        replayed_at=_time(fields.get(b"replayed")),
    )


def outcome(job_id: str, status: JobStatus, result: bytes | None, error: bytes | None) -> Any:
    """The result of a final job, or the :class:`JobFailed` its end raises."""
    if status is JobStatus.SUCCESS:
        if result is None:
            raise ResultNotKept(job_id)
        return orjson.loads(result)
    info = _error(error) or JobErrorInfo("Expired" if status is JobStatus.EXPIRED else "?", "")
    if status is JobStatus.EXPIRED:
        info = JobErrorInfo("Expired", "it was not started before it expired")
    raise JobFailed(job_id, status.value, info.type, info.message, info.traceback)


def status_reply(value: bytes | str | None, job_id: str, queue: str) -> JobStatus:
    """A job's ``status`` field as read (``HGET``).

    Error handling:
        :class:`~streamkit.jobs.JobNotFound` if there is no record of the job.
    """
    if value is None:
        raise JobNotFound(job_id, queue)
    return JobStatus(text(value))


def decode_output(entries: Any) -> tuple[list[JobChunk], str | None]:
    """The chunks of output stream entries ``[(id, fields), ...]``, and the final status
    if the end came among them."""
    chunks: list[JobChunk] = []
    for entry_id, fields in entries:
        end = fields.get(b"e")
        if end is not None:
            return chunks, text(end)
        raw = fields.get(b"c", b"null")
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = text(raw)
        chunks.append(JobChunk(value, int(fields.get(b"t", b"0")), text(entry_id)))
    return chunks, None


def _detail(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return text(raw)


def event_cursors(after: str | None, shards: int) -> list[str]:
    """The per-shard positions a job events cursor (:attr:`JobEvent.cursor`) says;
    every shard's start without one. A position is an entry id of the shard's event
    stream (every event up to that entry read), or an entry id and ``.N`` (its first N
    events read: a script call that changes many jobs writes their events as one entry).

    Error handling:
        :class:`~streamkit.ConfigError` for a cursor of another queue.
    """
    if after is None:
        return ["0-0"] * shards
    parts = after.split(",")
    if len(parts) != shards or not all(_is_position(p) for p in parts):
        raise ConfigError(
            "after", f"must be a cursor of this queue's {shards} shard(s), got {after!r}"
        )
    return parts


def _is_position(value: str) -> bool:
    entry, dot, index = value.partition(".")
    ms, _, seq = entry.partition("-")
    return ms.isdigit() and seq.isdigit() and (not dot or (index.isdigit() and int(index) > 0))


def events_after(position: str) -> str:
    """The entry id to read a shard's event stream after (exclusively) from
    ``position``: the entry itself, or the one before it if only part of it was read."""
    entry, dot, _ = position.partition(".")
    if not dot:
        return entry
    ms, seq = (int(n) for n in entry.split("-"))
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms else "0-0"


def decode_events(entry_id: Any, fields: Any, shard: int, cursors: list[str]) -> list[JobEvent]:
    """The :class:`JobEvent` s of an event stream entry of ``shard`` (one event: fields
    ``j``, ``n``, ``e``, ``d``; the events of a script call that changed many jobs: field
    ``b``, a JSON array of id, name, kind and detail per event), but those before
    ``cursors[shard]``; moves ``cursors`` (every shard's position) past each."""
    entry = text(entry_id)
    at = datetime.fromtimestamp(int(entry.split("-", 1)[0]) / 1000, UTC)
    batch = fields.get(b"b")
    if batch is None:
        cursors[shard] = entry
        raw = (fields.get(b"j", b""), fields.get(b"n", b""), fields.get(b"e", b""))
        one = (text(raw[0]), text(raw[1]), text(raw[2]), _detail(fields.get(b"d", b"")))
        return [_event(one, at, shard, entry, cursors)]
    values = orjson.loads(batch)
    count = len(values) // 4
    position, _, read = cursors[shard].partition(".")
    skip = int(read) if read and position == entry else 0
    events = []
    for index in range(skip + 1, count + 1):
        job_id, name, kind, detail = values[4 * index - 4 : 4 * index]
        cursors[shard] = entry if index == count else f"{entry}.{index}"
        decoded = (job_id, name, kind, _detail(detail.encode()) if detail else None)
        events.append(_event(decoded, at, shard, f"{entry}.{index}", cursors))
    cursors[shard] = entry
    return events


def _event(
    values: tuple[str, str, str, Any], at: datetime, shard: int, event_id: str, cursors: list[str]
) -> JobEvent:
    job_id, name, kind, detail = values
    return JobEvent(
        kind=kind,
        job_id=job_id,
        name=name,
        at=at,
        detail=detail,
        shard=shard,
        id=event_id,
        cursor=",".join(cursors),
    )


def progress_value(raw: bytes | None) -> Any:
    """A job's progress value (``current_job().progress``) from its record."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return text(raw)


def info_reply(fields: dict[bytes, bytes], job_id: str, queue: str) -> JobInfo:
    """A job's record as read (``HGETALL``), decoded.

    Error handling:
        :class:`~streamkit.jobs.JobNotFound` if there is no record of the job.
    """
    if not fields or b"status" not in fields:
        raise JobNotFound(job_id, queue)
    return decode_info(queue, job_id, fields)


def watch_reply(reply: Any, job_id: str, queue: str) -> tuple[bool, Any]:
    """The watch script's reply: ``(True, result)`` for a job that is over, ``(False,
    None)`` for one that is not (finishing it will notify the waiters).

    Error handling:
        :class:`~streamkit.jobs.JobNotFound` if there is no record of the job;
        :class:`~streamkit.jobs.JobFailed` or :class:`~streamkit.jobs.ResultNotKept`
        as by :func:`outcome` for a job that is over.
    """
    if not reply:
        raise JobNotFound(job_id, queue)
    status = JobStatus(text(reply[0]))
    if not status.final:
        return False, None
    return True, outcome(job_id, status, reply[1], reply[2])


def abort_reply(reply: Any, job_id: str, queue: str) -> JobStatus:
    """The abort script's reply (its outcome, and how many of the job's dependents are
    left for later calls to settle; or the outcome alone), as the job's status after
    the call.

    Error handling:
        :class:`~streamkit.jobs.JobNotFound` if there is no record of the job.
    """
    if isinstance(reply, list | tuple):
        reply = reply[0]
    said = text(reply)
    if said == "unknown":
        raise JobNotFound(job_id, queue)
    if said == "requested":
        return JobStatus.EXECUTING
    return JobStatus(said)
