"""The scenario app, except that worker process 1 of ``worker --processes`` cannot
import it: a configuration error in one worker (exit code 2) that the supervisor must
not restart. The supervisor itself, and worker 0, import it fine."""

from __future__ import annotations

import os

from tests.apps.scenario import app

__all__ = ["app"]

if os.environ.get("STREAMKIT_WORKER_INDEX") == "1":
    raise RuntimeError("worker 1 refuses this configuration")
