"""Compression of JSON payloads: the algorithms, named once, and bounded decompression.

Settings, codecs and the Spark data source accept the same names, the ones of
:data:`Compression`; the codec writes each compressed payload to a stream field that
names its algorithm (``data:lz4``, ``data:zstd``), so consumers decode whatever
producers chose.

Payloads come from whoever can write to a stream, so decompression is bounded: a
payload is decompressed into at most a given number of bytes (the
``max_decoded_size`` setting), and one that declares or produces more is refused
without being decompressed whole (see ``docs/security.md``).
"""

from __future__ import annotations

import threading
import typing
from typing import TYPE_CHECKING, Any, Literal

import lz4.frame
import zstandard

from ._validate import one_of

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "TooLarge",
    "compressor",
    "decompressor",
    "valid_compression",
]

Compression = Literal["lz4", "zstd"]
"""The compression algorithms a JSON codec can apply to its payload."""

#: Every algorithm of :data:`Compression`, in order.
COMPRESSIONS: tuple[Compression, ...] = typing.get_args(Compression)

#: A compression setting: one of :data:`COMPRESSIONS`, or ``None`` for none.
valid_compression = one_of(*COMPRESSIONS, None)

# A middle level: most of the ratio of higher levels at a fraction of their cost.
_ZSTD_LEVEL = 3

# Output is produced this many bytes at a time when a frame does not declare its size.
_READ_SIZE = 2**20
# The decoding window zstd frames may always ask for: that of level 19.
_MIN_WINDOW = 8 * 2**20


class TooLarge(ValueError):
    """A payload decompresses, or says it does, to more bytes than allowed."""


# zstandard contexts are costly to create (about 10 us) and must not be used by two
# threads at once; codecs are shared (worker threads, Spark), so keep one per thread.
_zstd_contexts = threading.local()


def _zstd_compress(payload: bytes) -> bytes:
    try:
        compressor = _zstd_contexts.compressor
    except AttributeError:
        compressor = _zstd_contexts.compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    return compressor.compress(payload)  # type: ignore[no-any-return]


def _zstd_window(limit: int) -> int:
    # The window (the history a frame may refer back to) is memory the decoder holds.
    # Frames of a known size need none beyond it; streamed frames take the window of
    # their compression level (2 MiB at level 3, 8 MiB at 19), whatever they hold.
    return max(_MIN_WINDOW, 1 << (limit - 1).bit_length())


def _zstd_decompressor(window: int) -> Any:
    try:
        by_window: dict[int, Any] = _zstd_contexts.decompressors
    except AttributeError:
        by_window = _zstd_contexts.decompressors = {}
    decompressor = by_window.get(window)
    if decompressor is None:
        if len(by_window) > 8:
            by_window.clear()
        decompressor = by_window[window] = zstandard.ZstdDecompressor(max_window_size=window)
    return decompressor


def _zstd_decompress(payload: bytes, limit: int) -> bytes:
    size = zstandard.frame_content_size(payload)
    if size > limit:
        raise TooLarge(f"its frame header declares {size} bytes")
    window = _zstd_window(limit)
    wanted = zstandard.get_frame_parameters(payload).window_size
    if size < 0 and wanted > window:
        raise TooLarge(f"its frame asks for a window of {wanted} bytes")
    decompressor = _zstd_decompressor(window)
    if size >= 0:
        # The declared size is the output buffer: a frame decoding to more fails.
        return decompressor.decompress(payload)  # type: ignore[no-any-return]
    # Streaming encoders (in other languages too) leave the content size out: read
    # the frame a slice at a time, and stop as soon as it exceeds the limit.
    parts = []
    total = 0
    with decompressor.stream_reader(payload) as reader:
        while part := reader.read(min(_READ_SIZE, limit + 1 - total)):
            parts.append(part)
            total += len(part)
            if total > limit:
                raise TooLarge("it decodes to more")
    return b"".join(parts)


def _lz4_decompress(payload: bytes, limit: int) -> bytes:
    size = lz4.frame.get_frame_info(payload)["content_size"]  # 0: not declared
    if size > limit:
        raise TooLarge(f"its frame header declares {size} bytes")
    decompressor = lz4.frame.LZ4FrameDecompressor()
    output: bytes = decompressor.decompress(payload, max_length=limit + 1)
    if len(output) > limit:
        raise TooLarge("it decodes to more")
    if not decompressor.eof:
        raise ValueError("the frame is truncated")
    return output


_COMPRESSORS: dict[Compression, Callable[[bytes], bytes]] = {
    "lz4": lz4.frame.compress,
    "zstd": _zstd_compress,
}
_DECOMPRESSORS: dict[Compression, Callable[[bytes, int], bytes]] = {
    "lz4": _lz4_decompress,
    "zstd": _zstd_decompress,
}


def compressor(compression: Compression) -> Callable[[bytes], bytes]:
    """The function compressing a payload with ``compression``."""
    return _COMPRESSORS[compression]


def decompressor(compression: Compression) -> Callable[[bytes, int], bytes]:
    """The function decompressing a payload compressed with ``compression``.

    ``decompress(payload, limit)`` returns at most ``limit`` bytes and never holds
    much more than that in memory, whatever the payload declares or contains: a
    compressed payload (a "decompression bomb") can otherwise stand for gigabytes.

    Raises:
        TooLarge: (from the function) the payload declares or decodes to more than
            ``limit`` bytes.
        Exception: (from the function) the payload is not a valid frame; the
            compression library's own error.
    """
    return _DECOMPRESSORS[compression]
