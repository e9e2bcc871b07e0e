"""Codecs: turning records into Redis stream fields and back.

The wire format is shared by producers, consumers and the Spark data source, and is
specified in ``docs/records.md``; change it only together with that page.

A JSON codec goes through the strict cattrs converter of
:mod:`streamkit._json_converter` and may compress with :mod:`streamkit._compression`;
a primitive codec writes one stream field per record field. Encoding and decoding sit
on the hot path, so a :class:`Codec` resolves every cattrs hook and field table once,
when it is built, and does no type dispatch per event; for records of plain fields it
uses functions generated for the type (:mod:`streamkit._codec_fast`), and it decodes a
batch at once (:meth:`Codec.batch_decoder`).

Entries come from whoever can write to the stream, so decoding is bounded: a JSON
payload larger than ``max_decoded_size`` once decompressed is refused without being
decompressed whole, and JSON nested deeper than 1,024 levels is refused by the parser.
Encoding refuses what consumers would refuse, and records over ``max_record_size``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import attrs
import cattrs
import orjson

from ._codec_check import (
    EXACT_TYPES,
    check_value,
    describe_invalid,
    mapping_problems,
    record_problems,
)
from ._codec_fast import (
    entry_encoder,
    exact_checker,
    flat_builder,
    payload_decoder,
    payloads_encoder,
)
from ._codec_primitive import primitive_slots
from ._compression import (
    COMPRESSIONS,
    Compression,
    TooLarge,
    compressor,
    decompressor,
    valid_compression,
)
from ._errors import ConfigError, DecodeError, EncodeError
from ._json_converter import converter
from ._records import is_primitive
from ._validate import positive_int
from ._wire import DEFAULT_MAX_DECODED_SIZE, DEFAULT_MAX_RECORD_SIZE, field_pairs, format_size

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["Codec", "Compression", "codec_for"]

R = TypeVar("R")

#: The stream field holding a JSON payload, by compression; every entry names its own
#: compression so consumers decode whatever producers chose.
_DATA_FIELDS: dict[Compression | None, bytes] = {
    None: b"data",
    **{compression: b"data:" + compression.encode() for compression in COMPRESSIONS},
}
_DATA_FIELD_NAMES = (
    ", ".join(repr(field) for field in list(_DATA_FIELDS.values())[:-1])
    + f" or {list(_DATA_FIELDS.values())[-1]!r}"
)


# ---------------------------------------------------------------------------------------
# The codec (primitive mode's field forms are in _codec_primitive)


def _no_payloads(values: Sequence[Any]) -> list[bytes | None]:
    """A codec with no fast path: every record goes to its entry encoder."""
    return [None] * len(values)


class _BadEntry(Exception):
    """Raised inside decoding with a reason worth showing as is."""


# The longest reason an error carries: reasons quote what the producer wrote (a dict
# key in a path, a value), and go to dead letters, logs and terminals.
_MAX_REASON = 500


def _reason(exc: Exception) -> str:
    if isinstance(exc, _BadEntry):
        reason = str(exc)
    elif isinstance(exc, orjson.JSONDecodeError):
        reason = f"invalid JSON: {exc}"
    elif isinstance(exc, cattrs.BaseValidationError):
        reason = "; ".join(cattrs.transform_error(exc))
    else:
        reason = f"{type(exc).__name__}: {exc}"
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    return reason


def _check_record(_: object, __: attrs.Attribute[Any], record: object) -> None:
    if record is not dict and not (isinstance(record, type) and attrs.has(record)):
        raise ConfigError(
            "record", f"expected a Record subclass, an attrs class or dict, got {record!r}"
        )


def _check_compression(codec: Codec[Any], _: attrs.Attribute[Any], compression: object) -> None:
    valid_compression.check("compression", compression)
    if compression is not None and is_primitive(codec.record):
        raise ConfigError(
            "compression",
            f"{codec.record.__qualname__} is a primitive record, stored as plain stream "
            f"fields, which are not compressed",
        )


@attrs.frozen(kw_only=True)
class Codec(Generic[R]):
    """Encodes records of one type into stream fields, and decodes them back.

    Build codecs once and reuse them: construction resolves every conversion so that
    :meth:`encode` and :meth:`decode` do no per-call dispatch. Codecs are immutable,
    hashable and safe to share between tasks.

    Attributes:
        record: the record type: a :class:`~streamkit.Record` subclass, any other attrs
            class (stored as JSON), or ``dict`` for schemaless JSON objects.
        compression: ``"lz4"``, ``"zstd"`` or ``None``; applies to JSON records only.
        max_decoded_size: the most bytes a JSON payload may take once decompressed
            (16 MiB by default); a larger one is undecodable, and is refused without
            being decompressed whole. Records whose JSON is larger are not encoded.
        max_record_size: the most bytes an encoded record (its field names and
            values, after compression) may take (16 MiB by default).
        stream: the name of the stream it encodes for, which its errors about a
            record's fields name first (``orders: Order.order_id: expected int, got
            str 'x'``); a stream's codec has it.

    Error handling:
        An invalid ``record``, ``compression`` or limit raises
        :class:`~streamkit.ConfigError`.
    """

    record: type[R] = attrs.field(validator=_check_record)
    compression: Compression | None = attrs.field(default=None, validator=_check_compression)
    max_decoded_size: int = attrs.field(default=DEFAULT_MAX_DECODED_SIZE, validator=positive_int)
    max_record_size: int = attrs.field(default=DEFAULT_MAX_RECORD_SIZE, validator=positive_int)
    stream: str | None = attrs.field(default=None, eq=False)
    _encode: Callable[[R], dict[bytes, bytes]] = attrs.field(init=False, repr=False, eq=False)
    _decode: Callable[[Mapping[bytes, bytes]], R] = attrs.field(init=False, repr=False, eq=False)
    _decode_payload: Callable[[bytes], R] = attrs.field(init=False, repr=False, eq=False)
    # The functions generated for batches, made once (entry_encoder, ...).
    _generated: dict[Any, Any] = attrs.field(init=False, repr=False, eq=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if is_primitive(self.record):
            encode, decode = self._primitive_functions()
        else:
            encode, decode = self._json_functions()
        # Frozen: the functions are derived from the fields, never reassigned.
        object.__setattr__(self, "_encode", encode)
        object.__setattr__(self, "_decode", decode)

    @property
    def name(self) -> str:
        """The wire format: ``"json"``, ``"json+lz4"``, ``"json+zstd"`` or ``"primitive"``.

        Stream metadata records it so that a mismatched producer is refused.
        """
        if is_primitive(self.record):
            return "primitive"
        return "json" if self.compression is None else f"json+{self.compression}"

    def encode(self, record: R) -> dict[bytes, bytes]:
        """Turn a record into the fields of a stream entry.

        Raises:
            EncodeError: the record is not of this codec's type, holds a value the
                wire format cannot represent (an int beyond 64 bits or a NaN in JSON
                mode, a string where an int field is declared, ...), or is too large:
                more than ``max_record_size`` encoded, or JSON of more than
                ``max_decoded_size`` (which consumers would refuse).
        """
        return self._encode(record)

    def decode(
        self,
        fields: Mapping[bytes, bytes],
        *,
        stream: str,
        partition: int | None = None,
        entry_id: str | bytes | None = None,
    ) -> R:
        """Turn the fields of a stream entry back into a record.

        Fields the codec does not know are ignored, so producers may add fields (with
        defaults) before consumers know them.

        Args:
            fields: the entry's fields, as Redis returns them.
            stream: the stream's name, for the error message.
            partition: the partition number, for the error message.
            entry_id: the entry's id, for the error message.

        Raises:
            DecodeError: the entry is not a valid encoding of this codec's record type
                (missing or corrupt payload, a payload larger than
                ``max_decoded_size`` once decompressed, invalid JSON or JSON nested
                deeper than 1,024 levels, missing field, wrong type); it carries
                ``stream``, ``partition`` and ``entry_id``.
        """
        try:
            return self._decode(fields)
        except Exception as exc:
            raise _decode_error(exc, stream, partition, entry_id) from exc

    def entry_decoder(
        self, *, stream: str, partition: int | None = None
    ) -> Callable[[list[bytes], bytes | str | None], R]:
        """A function decoding an entry from its flat field list, as Redis returns it.

        ``decode(flat, entry_id)`` is :meth:`decode` for ``[name, value, ...]`` lists,
        made once per partition so that the hot path builds no dict per entry.

        Raises:
            DecodeError: (from the function) as :meth:`decode` does.
        """
        slow = self._decode

        if is_primitive(self.record):

            def decode_flat(flat: list[bytes]) -> R:
                return slow(field_pairs(flat))

        else:
            fast = self._decode_payload

            def decode_flat(flat: list[bytes]) -> R:
                if len(flat) == 2 and flat[0] == b"data":
                    return fast(flat[1])
                return slow(field_pairs(flat))

        def decode(flat: list[bytes], entry_id: bytes | str | None) -> R:
            try:
                return decode_flat(flat)
            except Exception as exc:
                raise _decode_error(exc, stream, partition, entry_id) from exc

        return decode

    def batch_decoder(self, missing: Any) -> Callable[[list[list[bytes]]], tuple[list[Any], int]]:
        """A function decoding a batch of entries at once, from their flat field lists.

        ``decode_batch(flats)`` returns ``(records, missed)``: one item per entry, its
        record or ``missing`` for an entry this function does not decode (a corrupt,
        oversized or otherwise unusual one), to be decoded alone by the
        :meth:`entry_decoder`, which raises its :class:`~streamkit.DecodeError`; and
        how many it missed.
        """
        made = self._generated.get(("batch", missing))
        if made is not None:
            return made  # type: ignore[no-any-return]
        payloads = self.payload_decoder(missing)
        slow = self._decode

        def decode_batch(flats: list[list[bytes]]) -> tuple[list[Any], int]:
            if payloads is not None and all(
                len(flat) == 2 and flat[0] == b"data" for flat in flats
            ):
                return payloads([flat[1] for flat in flats])
            out: list[Any] = []
            missed = 0
            for flat in flats:
                try:
                    out.append(slow(field_pairs(flat)))
                except Exception:
                    out.append(missing)
                    missed += 1
            return out, missed

        self._generated["batch", missing] = decode_batch
        return decode_batch

    def payload_decoder(
        self, missing: Any
    ) -> Callable[[list[bytes]], tuple[list[Any], int]] | None:
        """A function decoding the ``data`` fields of a batch of JSON entries at once.

        ``decode_payloads(payloads)`` returns ``(records, missed)`` as the
        :meth:`batch_decoder`'s function does, for entries whose only field is an
        uncompressed JSON ``data`` field. Records of plain ``str``/``int``/``float``/
        ``bool`` fields are built by code generated for the record, with exactly the
        checks of the converter: one Python call per entry, the record's
        ``__init__``. ``None`` for a primitive codec, whose entries have no payload.
        """
        if is_primitive(self.record):
            return None
        made = self._generated.get(("payloads", missing))
        if made is not None:
            return made  # type: ignore[no-any-return]
        self._generated["payloads", missing] = made = self._payload_decoder(missing)
        return made

    def _payload_decoder(self, missing: Any) -> Callable[[list[bytes]], tuple[list[Any], int]]:
        fast = self._decode_payload
        record = self.record
        structure = None if record is dict else converter.get_structure_hook(record)
        generated = None
        if structure is not None:
            generated = payload_decoder(record, structure, missing, self.max_decoded_size)
        if generated is not None:
            return generated

        def decode_payloads(payloads: list[bytes]) -> tuple[list[Any], int]:
            out: list[Any] = []
            missed = 0
            for payload in payloads:
                try:
                    out.append(fast(payload))
                except Exception:
                    out.append(missing)
                    missed += 1
            return out, missed

        return decode_payloads

    def entry_encoder(self) -> Callable[[R], tuple[Sequence[bytes | int], int]]:
        """A function encoding a record as a producer lays it out: ``(entry, size)``,
        the entry's script arguments (its field count, then field names and values)
        and its size in bytes (names and values).

        It encodes exactly as :meth:`encode` does, and raises its errors. A JSON
        record of plain ``str``/``int``/``float``/``bool`` fields without compression
        is encoded by code generated for the record, which leaves anything unusual
        (a value of another type, a float that is not finite, a record too large) to
        :meth:`encode`.
        """
        made: Callable[[R], tuple[Sequence[bytes | int], int]] | None
        made = self._generated.get("entry")
        if made is None:
            made = self._generated["entry"] = self._entry_encoder()
        return made

    def _entry_encoder(self) -> Callable[[R], tuple[Sequence[bytes | int], int]]:
        encode = self._encode

        def encode_entry(value: R) -> tuple[Sequence[bytes | int], int]:
            fields = encode(value)
            entry: list[bytes | int] = [len(fields)]
            size = 0
            for name, raw in fields.items():
                entry.append(name)
                entry.append(raw)
                size += len(name) + len(raw)
            return entry, size

        record = self.record
        if self.compression is not None or is_primitive(record):
            return encode_entry
        data_field = _DATA_FIELDS[None]
        # The most a payload may take: consumers' max_decoded_size, and what is left
        # of max_record_size after the field name.
        limit = min(self.max_decoded_size, self.max_record_size - len(data_field))
        fast = entry_encoder(record, data_field, limit, encode_entry)
        return encode_entry if fast is None else fast

    def payloads_encoder(self) -> tuple[Callable[[Sequence[R]], list[bytes | None]], bytes, int]:
        """A function encoding many records at once as the entry encoder's fast path
        does, with the entry's field name and the largest payload it may carry:
        ``(encode_payloads, data_field, limit)``.

        ``encode_payloads(records)`` gives each record's JSON payload, or ``None``
        where the entry encoder must encode it (anything unusual, or a codec with no
        fast path: then every one is ``None``). A payload over ``limit`` bytes also
        goes to the entry encoder, which raises its error.
        """
        made = self._generated.get("payloads encoder")
        if made is None:
            made = self._generated["payloads encoder"] = self._payloads_encoder()
        return cast("tuple[Callable[[Sequence[R]], list[bytes | None]], bytes, int]", made)

    def _payloads_encoder(self) -> tuple[Callable[[Sequence[R]], list[bytes | None]], bytes, int]:
        data_field = _DATA_FIELDS[None]
        fast = None
        if self.compression is None and not is_primitive(self.record):
            fast = payloads_encoder(self.record)
        if fast is None:
            return _no_payloads, data_field, -1
        limit = min(self.max_decoded_size, self.max_record_size - len(data_field))
        return fast, data_field, limit

    def from_dict(self, data: Mapping[str, Any]) -> R:
        """Build a record from a JSON-like mapping (as parsed from JSON text).

        Values are checked as strictly as :meth:`decode` checks them: this is how the
        command line turns a line of JSON Lines into a record.

        Raises:
            EncodeError: the mapping does not describe a valid record; the message
                names the offending field.
        """
        if self.record is dict:
            return dict(data)  # type: ignore[return-value]
        try:
            return converter.structure(data, self.record)
        except Exception as exc:
            problems = mapping_problems(self.record, data, exc)
            if not problems:
                raise EncodeError(_reason(exc)) from exc
            raise EncodeError(self._named(describe_invalid(problems))) from exc

    def _invalid(self, value: object, fallback: str) -> EncodeError:
        """The error for an invalid ``value``: its fields' problems (see
        :mod:`streamkit._codec_check`), after the stream's name, or ``fallback`` where
        no field says why."""
        record = self.record
        problems = record_problems(record, value) if attrs.has(record) else []
        if not problems:
            return EncodeError(fallback)
        return EncodeError(self._named(describe_invalid(problems)))

    def _named(self, message: str) -> str:
        return message if self.stream is None else f"{self.stream}: {message}"

    def _json_functions(
        self,
    ) -> tuple[Callable[[R], dict[bytes, bytes]], Callable[[Mapping[bytes, bytes]], R]]:
        record = self.record
        type_name = record.__qualname__
        # A plain dict goes through the converter too, so that its datetimes, bytes and
        # Decimals are written exactly as a record's would be.
        unstructure = converter.get_unstructure_hook(record)
        if record is dict:
            unstructure = _plain_first(unstructure)
        structure = None if record is dict else converter.get_structure_hook(record)
        data_field = _DATA_FIELDS[self.compression]
        compress = None if self.compression is None else compressor(self.compression)
        max_decoded = self.max_decoded_size
        max_record = self.max_record_size
        # The payload may take what is left of the record's size after its field name.
        max_payload = max_record - len(data_field)

        loads = orjson.loads
        build = None if structure is None else flat_builder(record, structure)

        # The rule of streamkit._codec_check: a record is valid when the decoder takes
        # its JSON back (schemaless dicts are any JSON object).
        check: Callable[[Any], Any] | None = None
        # Fields holding exactly their annotated scalar types need no round trip.
        exact = None if structure is None else exact_checker(record, EXACT_TYPES)
        if build is not None:
            check = build
        elif structure is not None:
            hook = structure

            def check(obj: Any) -> Any:
                return hook(obj, record)

        def encode(value: R) -> dict[bytes, bytes]:
            if type(value) is not record and not (record is dict and isinstance(value, dict)):
                raise EncodeError(f"expected a {type_name}, got {type(value).__qualname__}")
            try:
                payload = orjson.dumps(unstructure(value))
            except Exception as exc:
                why = f"cannot encode {type_name} as JSON: {exc}"
                raise self._invalid(value, why) from exc
            if len(payload) > max_decoded:
                raise EncodeError(
                    f"the {type_name} is {format_size(len(payload))} of JSON, more than "
                    f"max_decoded_size ({format_size(max_decoded)}), which consumers refuse"
                )
            if check is not None and (exact is None or not exact(value)):
                try:
                    check(loads(payload))
                except Exception as exc:
                    why = f"the {type_name} would not decode: {_reason(exc)}"
                    raise self._invalid(value, why) from exc
            if compress is not None:
                payload = compress(payload)
            if len(payload) > max_payload:
                raise _too_large(type_name, len(payload) + len(data_field), max_record)
            return {data_field: payload}

        def decode_payload(payload: bytes) -> R:
            if len(payload) > max_decoded:
                raise _BadEntry(
                    f"the JSON payload is {format_size(len(payload))}, more than "
                    f"max_decoded_size ({format_size(max_decoded)})"
                )
            obj = loads(payload)
            if type(obj) is not dict:
                kind = type(obj).__name__
                article = "an" if kind[:1] in "aeiou" else "a"
                raise _BadEntry(f"the JSON payload is {article} {kind}, not an object")
            if build is not None:
                return build(obj)  # type: ignore[no-any-return]
            if structure is None:
                return obj  # type: ignore[return-value]
            return structure(obj, record)  # type: ignore[no-any-return]

        def decode(fields: Mapping[bytes, bytes]) -> R:
            payload = fields.get(b"data")
            if payload is None:
                payload = _decompressed(fields, max_decoded)
            return decode_payload(payload)

        object.__setattr__(self, "_decode_payload", decode_payload)
        return encode, decode

    def _primitive_functions(
        self,
    ) -> tuple[Callable[[R], dict[bytes, bytes]], Callable[[Mapping[bytes, bytes]], R]]:
        record = self.record
        type_name = record.__qualname__
        slots = primitive_slots(record)
        max_size = self.max_record_size
        # Per slot, the value types that pass it as they are; any other value is
        # checked by the rule of streamkit._codec_check (a float's text form holds
        # NaN and the infinities, which JSON does not).
        exact = [EXACT_TYPES.get(slot.field.scalar, (slot.field.scalar,)) for slot in slots]
        named = self._named

        def encode(value: R) -> dict[bytes, bytes]:
            if type(value) is not record:
                raise EncodeError(f"expected a {type_name}, got {type(value).__qualname__}")
            fields = {}
            size = 0
            for slot, types in zip(slots, exact, strict=True):
                item = getattr(value, slot.field.name)
                if item is None:
                    if slot.field.optional:
                        continue  # None is stored by leaving the field out
                    raise EncodeError(f"{type_name}.{slot.field.name} is None but not optional")
                try:
                    if type(item) not in types:
                        check_value(slot.field.scalar, item)
                    raw = fields[slot.key] = slot.encode(item)
                except Exception as exc:
                    raise EncodeError(
                        named(
                            f"{type_name}.{slot.field.name}={item!r} cannot be stored as a "
                            f"{slot.field.scalar.__qualname__} (got a {type(item).__qualname__})"
                        )
                    ) from exc
                size += len(slot.key) + len(raw)
            if size > max_size:
                raise _too_large(type_name, size, max_size)
            return fields

        def decode(fields: Mapping[bytes, bytes]) -> R:
            kwargs: dict[str, Any] = {}
            for slot in slots:
                raw = fields.get(slot.key)
                if raw is None:
                    if slot.field.optional:
                        kwargs[slot.field.alias] = None
                    elif slot.field.required:
                        raise _BadEntry(f"missing field {slot.field.name!r}")
                    continue
                try:
                    kwargs[slot.field.alias] = slot.decode(raw)
                except Exception as exc:
                    raise _BadEntry(
                        f"field {slot.field.name!r} is not a valid "
                        f"{slot.field.scalar.__qualname__}: {bytes(raw[:40])!r}"
                    ) from exc
            return record(**kwargs)

        return encode, decode


#: The JSON scalars the converter hands to orjson unchanged (floats: when finite).
_JSON_SCALARS = frozenset({str, int, bool, type(None)})


def _plain_first(unstructure: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``unstructure`` for dicts, except that a dict of text keys and JSON scalars (the
    common output of a table or a window) goes to orjson as it is: the converter would
    return it unchanged, one hook call per item later."""

    def to_json(mapping: dict[Any, Any]) -> Any:
        for key, value in mapping.items():
            kind = type(value)
            if type(key) is not str or (
                kind not in _JSON_SCALARS and (kind is not float or not math.isfinite(value))
            ):
                return unstructure(mapping)
        return mapping

    return to_json


def _too_large(type_name: str, size: int, limit: int) -> EncodeError:
    return EncodeError(
        f"the encoded {type_name} is {format_size(size)}, more than max_record_size "
        f"({format_size(limit)})"
    )


def _decode_error(
    exc: Exception, stream: str, partition: int | None, entry_id: str | bytes | None
) -> DecodeError:
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode("ascii", "replace")
    return DecodeError(_reason(exc), stream=stream, partition=partition, entry_id=entry_id)


def _decompressed(fields: Mapping[bytes, bytes], limit: int) -> bytes:
    for compression in COMPRESSIONS:
        payload = fields.get(_DATA_FIELDS[compression])
        if payload is not None:
            try:
                return decompressor(compression)(payload, limit)
            except TooLarge as exc:
                raise _BadEntry(
                    f"the {compression} payload decompresses to more than max_decoded_size "
                    f"({format_size(limit)}): {exc}"
                ) from exc
            except Exception as exc:
                raise _BadEntry(f"corrupt {compression} payload: {exc}") from exc
    # Names come from the producer: a few, each cut short, keep the message one line.
    present = ", ".join(repr(bytes(name[:40])) for name in list(fields)[:5]) or "none"
    raise _BadEntry(f"no {_DATA_FIELD_NAMES} field (fields: {present})")


def codec_for(
    record: type[R],
    *,
    compression: str | None = None,
    max_decoded_size: int = DEFAULT_MAX_DECODED_SIZE,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    stream: str | None = None,
) -> Codec[R]:
    """Build the codec for a record type, checking a compression name given as text.

    Args:
        record: a :class:`~streamkit.Record` subclass, any other attrs class, or
            ``dict``. Primitive records get the primitive codec, all others JSON.
        compression: ``"lz4"``, ``"zstd"`` or ``None`` (the default).
        max_decoded_size: the most bytes a JSON payload may take once decompressed.
        max_record_size: the most bytes an encoded record may take.
        stream: the stream's name, named first by errors about a record's fields.

    Raises:
        ConfigError: ``record`` is not a supported type, ``compression`` is not a
            known algorithm or is given for a primitive record, or a limit is not a
            positive integer.
    """
    valid_compression.check("compression", compression)
    return Codec(
        record=record,
        # Checked just above: the text is a Compression name, or None.
        compression=cast("Compression | None", compression),
        max_decoded_size=max_decoded_size,
        max_record_size=max_record_size,
        stream=stream,
    )
