"""Parameters packed in bulk: column arrays in PostgreSQL's binary format, sent by one libpq call.

psycopg adapts a list parameter one value at a time (0.3-1 µs each in its binary format, more
in text); the funnel's columns are uniform, so an ``int8[]`` of 1,000 keys is one ``map`` over a
``struct`` packer and one ``bytes.join``. :func:`encode` covers the common element types and
returns None for anything it does not reproduce exactly (another type, mixed Python types, a
value out of range, text with NUL or surrogates, a connection not in UTF-8); the caller then
passes the plain list and psycopg adapts it, so every value reaches the server as it would
without this module and a bad one is refused by the server the same way.

:func:`execute` sends a statement whose parameters are all packed as one prepared libpq call,
which releases the GIL for the whole round trip; psycopg's own path takes the GIL back at each
socket wait, where many writer threads and a busy caller queue for it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.adapt import Dumper
from psycopg.pq.abc import PGresult

_HEADER = struct.Struct(">5i")  # dimensions, has nulls, element oid, length, lower bound
_EMPTY = struct.Struct(">3i")  # an empty array: no dimensions
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_NONE = type(None)

# array element type -> (element oid, struct code, the Python types it takes unchanged)
_FIXED: dict[str, tuple[int, str, frozenset[type]]] = {
    "bigint": (20, "q", frozenset({int})),
    "integer": (23, "i", frozenset({int})),
    "smallint": (21, "h", frozenset({int})),
    "double precision": (701, "d", frozenset({float, int})),  # all floats or all ints
    "real": (700, "f", frozenset({float})),  # not int: packing rounds it twice, the server once
    "boolean": (16, "?", frozenset({bool})),
}
_VARLENA: dict[str, tuple[int, type]] = {"text": (25, str), "bytea": (17, bytes)}
_PACK = {t: struct.Struct(f">i{code}").pack for t, (_, code, _) in _FIXED.items()}
_SIZE = {t: struct.calcsize(f">{code}") for t, (_, code, _) in _FIXED.items()}


class Encoded:
    """A parameter already in PostgreSQL's binary format (its type comes from the cast in the
    statement, e.g. ``%(p0)s::bigint[]``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _EncodedDumper(Dumper):
    format = pq.Format.BINARY  # oid 0: the server types the parameter from its cast

    def dump(self, obj: Encoded) -> bytes:
        return obj.data


def register(conn: psycopg.Connection) -> None:
    """Let ``conn`` send :class:`Encoded` parameters as they are."""
    conn.adapters.register_dumper(Encoded, _EncodedDumper)


def encode(element_type: str, values: Sequence[Any], utf8: bool = True) -> Encoded | None:
    """``values`` as a binary one-dimensional ``element_type[]``, or None where psycopg should
    adapt them instead (see the module docstring). ``utf8``: the connection's client encoding
    is UTF-8 (text is sent as UTF-8 bytes)."""
    kinds = set(map(type, values))
    nulls = _NONE in kinds
    kinds.discard(_NONE)
    if element_type in _FIXED:
        oid, _, takes = _FIXED[element_type]
        if len(kinds) > 1 or not kinds <= takes:
            return None  # psycopg refuses a list of mixed types: so must we
        pack, size = _PACK[element_type], _SIZE[element_type]
        try:
            if nulls:
                parts = [_NULL if v is None else pack(size, v) for v in values]
            else:
                parts = list(map(pack, repeat(size, len(values)), values))
        except (struct.error, OverflowError):
            return None  # out of range: let the server say so, as it did before
    elif element_type in _VARLENA:
        oid, takes_one = _VARLENA[element_type]
        if not kinds <= {takes_one} or (takes_one is str and not utf8):
            return None
        present = [v for v in values if v is not None] if nulls else values
        try:
            data = list(map(str.encode, present)) if takes_one is str else list(present)
        except UnicodeEncodeError:
            return None
        if takes_one is str and b"\x00" in b"".join(data):
            return None  # psycopg refuses NUL in text before sending: keep its message
        lengths = list(map(_LENGTH.pack, map(len, data)))
        if nulls:
            it = iter(zip(lengths, data, strict=True))
            parts = [_NULL if v is None else b"".join(next(it)) for v in values]
        else:
            parts = [b""] * (2 * len(data))
            parts[::2], parts[1::2] = lengths, data
    else:
        return None
    if not values:
        return Encoded(_EMPTY.pack(0, 0, oid))
    return Encoded(_HEADER.pack(1, int(nulls), oid, len(values), 1) + b"".join(parts))


_PLACEHOLDER = re.compile(rb"%\(p(\d+)\)s")  # the statements' %(pN)s, as libpq's $N+1


def execute(
    conn: psycopg.Connection, prepared: dict[int, bytes], stmt: sql.Composable, params: dict
) -> bool:
    """Run ``stmt`` (autocommit, ``%(pN)s`` placeholders) as a prepared statement of ``conn``
    when every parameter is :class:`Encoded`; False (nothing sent) otherwise. ``prepared``:
    this connection's statement names by ``id(stmt)`` (the caller keeps its statements alive);
    errors are psycopg's (OperationalError where the connection is lost)."""
    values = list(params.values())
    if not all(type(v) is Encoded for v in values):
        return False
    pgconn = conn.pgconn
    name = prepared.get(id(stmt))
    if name is None:
        query = _PLACEHOLDER.sub(lambda m: b"$%d" % (int(m[1]) + 1), stmt.as_bytes(conn))
        name = b"krablet_%d" % len(prepared)
        _check(conn, pgconn.prepare(name, query))
        prepared[id(stmt)] = name
    _check(conn, pgconn.exec_prepared(name, [v.data for v in values], [1] * len(values)))
    return True


def _check(conn: psycopg.Connection, result: PGresult) -> None:
    """Raise what psycopg would for a failed libpq result."""
    if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        return
    if conn.pgconn.status == pq.ConnStatus.BAD:
        raise psycopg.OperationalError(result.get_error_message() or "connection lost")
    raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
