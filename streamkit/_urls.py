"""Redis URLs in messages and logs: pure, so that Spark's workers can use it cheaply."""

from __future__ import annotations

import urllib.parse

__all__ = ["mask_url"]


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
