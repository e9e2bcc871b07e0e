"""Compression of JSON payloads: the algorithms, named once.

Settings, codecs and the Spark data source accept the same names, the ones of
:data:`Compression`; the codec writes each compressed payload to a stream field that
names its algorithm (``data:lz4``, ``data:zstd``), so consumers decode whatever
producers chose.
"""

from __future__ import annotations

import threading
import typing
from typing import TYPE_CHECKING, Literal

import lz4.frame
import zstandard

from ._validate import one_of

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["COMPRESSIONS", "Compression", "compressor", "decompressor", "valid_compression"]

Compression = Literal["lz4", "zstd"]
"""The compression algorithms a JSON codec can apply to its payload."""

#: Every algorithm of :data:`Compression`, in order.
COMPRESSIONS: tuple[Compression, ...] = typing.get_args(Compression)

#: A compression setting: one of :data:`COMPRESSIONS`, or ``None`` for none.
valid_compression = one_of(*COMPRESSIONS, None)

# A middle level: most of the ratio of higher levels at a fraction of their cost.
_ZSTD_LEVEL = 3

# zstandard contexts are costly to create (about 10 us) and must not be used by two
# threads at once; codecs are shared (worker threads, Spark), so keep one per thread.
_zstd_contexts = threading.local()


def _zstd_compress(payload: bytes) -> bytes:
    try:
        compressor = _zstd_contexts.compressor
    except AttributeError:
        compressor = _zstd_contexts.compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    return compressor.compress(payload)  # type: ignore[no-any-return]


def _zstd_decompress(payload: bytes) -> bytes:
    try:
        decompressor = _zstd_contexts.decompressor
    except AttributeError:
        decompressor = _zstd_contexts.decompressor = zstandard.ZstdDecompressor()
    if zstandard.frame_content_size(payload) < 0:
        # Streaming encoders (in other languages too) leave the content size out, and
        # only a decompressobj reads such frames.
        return decompressor.decompressobj().decompress(payload)  # type: ignore[no-any-return]
    return decompressor.decompress(payload)  # type: ignore[no-any-return]


_FUNCTIONS: dict[Compression, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "lz4": (lz4.frame.compress, lz4.frame.decompress),
    "zstd": (_zstd_compress, _zstd_decompress),
}


def compressor(compression: Compression) -> Callable[[bytes], bytes]:
    """The function compressing a payload with ``compression``."""
    return _FUNCTIONS[compression][0]


def decompressor(compression: Compression) -> Callable[[bytes], bytes]:
    """The function decompressing a payload compressed with ``compression``."""
    return _FUNCTIONS[compression][1]
