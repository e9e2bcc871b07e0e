"""The fault-injection reliability suite.

Every scenario runs real ``redis-server`` and real ``streamkit worker`` processes,
injects one kind of fault, counts every event (each has a unique ``(key, seq)`` id and
every processing is recorded in Redis) and reports events sent, processed, lost,
duplicated, order violations and recovery time as a :class:`ScenarioReport`
(see :mod:`tests.reliability.harness`). ``nox -s reliability`` turns the reports of a
run into ``docs/reliability.md``.
"""
