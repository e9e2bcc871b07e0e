"""What the job queue's scripts keep, and their budgets: every state change of a job is
one script, a file under ``streamkit/_lua/jobs/`` (their shared pieces under
``streamkit/_lua/lib/jobs/``), loaded by :mod:`streamkit._lua`.

Every script touches the keys of one shard only, all sharing the shard's hash tag, so
each stays a single-slot script on Redis Cluster.

Each script gets the shard's fixed keys (see :class:`~streamkit.jobs._layout.ShardKeys`):
``KEYS[1..3]`` the ready streams (high, normal, low), ``KEYS[4]`` the schedule,
``KEYS[5]`` the dead-letter stream, ``KEYS[6]`` the completion stream that result
waiters read, ``KEYS[7]`` the counters; ``ARGV[1]`` is the shard's key base, from which
a job's own keys are derived (same hash tag).

Times come from the server's clock (``TIME``), never a client's, except an absolute
``at=`` that the caller asked for. Job fields:

=============  =================================================================
field          meaning
=============  =================================================================
``name``       the job's name (which function runs it)
``args``       its arguments, JSON ``[args, kwargs]``
``status``     scheduled, waiting, sent, executing, retry, success, dead, aborted,
               expired
``prio``       0 high, 1 normal, 2 low: which ready stream it goes to
``tries``      times it was started; ``max_tries`` is retries + 1
``entry``      its entry id in the ready stream while it is queued or running
``owner``      the token of the claim running it now (fencing)
``lost``       times a worker died while running it (poison detection)
``result``     the JSON result; ``error`` the last error, JSON
``hist``       the tries, a line per start (``s,TRY,MS,WORKER``) and end
               (``e,TRY,MS,OUTCOME[,ERROR TYPE]``; outcome success, retry, dead,
               aborted, released, lost), the newest ~2 KB
``w``          set when someone waits for the result: finishing then notifies
``lim``        its limits, ``"rate,window_ms,conc,key_rate,key_window_ms,key_conc"``
               (0: none; absent for a job without limits); ``lk`` its limit key
``held``       why a ``held`` job waits (a limit or a pause); ``pk`` counts its
               parkings (an item of a park list names the parking it stands for);
               ``up`` is set while a job let out of a park list is queued
``hdr``        its headers, JSON (absent without headers)
=============  =================================================================

Limits and pauses (see :mod:`streamkit.jobs._limits`) keep their state under the shard's
base too: ``:rl:SCOPE`` (a sorted set, the starts in the rate window, a member per claim
that took places: ``PLACE#N``, scored by the claim's time), ``:rn:SCOPE`` (the number of
starts in it, with its expiry), ``:cc:SCOPE`` (a set, the jobs holding a concurrency
slot), ``:park:KIND:SCOPE`` (a list, the jobs held back, in order), ``:wake`` (a sorted
set, the scopes to look at again, by when), ``:lims`` (a hash, each parked scope's
limit) and ``:ctl`` (a hash, the paused job names; ``*`` for the whole queue). A scope
is ``n:NAME`` (a job name's limit) or ``k:NAME:KEY`` (a limit key's).
"""

from __future__ import annotations

from .._lua import CONSTANTS

__all__ = [
    "CONC_RECHECK_MS",
    "DUE_BUDGET",
    "GROUP",
    "HAND_BACK_BUDGET",
    "PENDING_BUDGET",
    "READ_BUDGET",
    "SETTLE_BUDGET",
    "UNPARK_BUDGET",
    "WAKE_BUDGET",
]

# The numbers the scripts read too are set in streamkit._lua.CONSTANTS (K.NAME there).

#: The consumer group of every ready stream.
GROUP = str(CONSTANTS["JOB_GROUP"])
#: Dependents a script settles per call, beside its own work (see ``settle_some``).
SETTLE_BUDGET = int(CONSTANTS["SETTLE_BUDGET"])
#: Scheduled jobs a claim moves to their ready streams per call, at most.
DUE_BUDGET = int(CONSTANTS["DUE_BUDGET"])
#: Pending entries a count reads per call, at most (an argument of jobs/counts).
PENDING_BUDGET = 250
#: Pending entries a hand-back reads per call, at most (it writes for each; an argument
#: of jobs/recover).
HAND_BACK_BUDGET = 100
#: Limit scopes a claim looks at again per call, at most (see ``wake_some``).
WAKE_BUDGET = int(CONSTANTS["WAKE_BUDGET"])
#: Held jobs let out of one park list per call, at most.
UNPARK_BUDGET = int(CONSTANTS["UNPARK_BUDGET"])
#: Ready entries a claim holds back per call before it stops reading (it may hold back
#: up to the jobs it was asked for, if every one it read is held back).
READ_BUDGET = int(CONSTANTS["READ_BUDGET"])
#: How often a scope with jobs waiting for a concurrency slot is looked at again
#: (ms), beside the slot's release: a safety net for a release that let no one out.
CONC_RECHECK_MS = int(CONSTANTS["CONC_RECHECK_MS"])
