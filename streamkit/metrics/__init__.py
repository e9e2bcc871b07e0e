"""streamkit.metrics: a worker's Prometheus metrics (the ``streamkit[metrics]`` extra).

``streamkit worker --metrics-port 9100`` serves them; in a service of your own, run
:func:`serve_metrics` beside the worker, or :func:`open_metrics` to add them to the
registry your service serves already. See the observability page of the docs for every
metric, and the Grafana dashboard built on them.
"""

try:
    import prometheus_client as _prometheus_client  # noqa: F401
except ImportError as _exc:  # pragma: no cover - the extra is installed in development
    raise ImportError(
        "streamkit.metrics needs prometheus-client: pip install '/path/to/streamkit[metrics]'"
    ) from _exc

from .._public import fix_module_metadata as _fix_module_metadata
from ._export import (
    Metrics as Metrics,
    open_metrics as open_metrics,
    serve_metrics as serve_metrics,
)

__all__ = ["Metrics", "open_metrics", "serve_metrics"]

_fix_module_metadata(__name__, globals())
del _fix_module_metadata
