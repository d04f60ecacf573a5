"""Typed configs: dataclasses loaded from TOML, overridden from the command line, saved per run.

A config is a tree of dataclasses. Leaves may be ``bool``, ``int``, ``float``, ``str``,
``Path``, an ``Enum`` (by value or name), ``X | None``, ``list[X]``, ``tuple[X, ...]`` or
``dict[str, X]``. Every mistake raises :class:`ConfigError`, one message naming the key,
the file and the closest valid key.

A ``dict[str, <dataclass>]`` field holds named sections (``stages.256``): a file's table or
``--set stages.256.max_aspect=2.5`` changes only the fields it names, on top of that
entry's default. A plain ``dict[str, X]`` given by a file replaces the default; ``--set
weights.a=0.5`` changes one key and keeps the others.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from krea2.infra.errors import UserError

T = TypeVar("T")


class ConfigError(UserError):
    """A config file or override does not match its dataclass."""


def _source(where: str | None) -> str:
    return f" in {where}" if where else ""


def _similarity(a: str, b: str) -> float:
    """Spelling similarity in [0, 2]; abbreviations (lr ~ learning_rate) count as close."""
    score = difflib.SequenceMatcher(None, a, b).ratio()
    initials_a, initials_b = ("".join(p[0] for p in n.split("_") if p) for n in (a, b))
    if initials_a == b or initials_b == a or a.startswith(b) or b.startswith(a):
        score += 1.0
    return score


def _closest(key: str, valid: Sequence[str]) -> str:
    if not valid:
        return ""
    best = max(valid, key=lambda v: _similarity(key, v))
    return f"; did you mean '{best}'?"


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, where: str | None) -> Any:
    """Convert a TOML value to ``tp``, or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def fail(expected: str) -> ConfigError:
        return ConfigError(
            f"config key '{key}'{_source(where)}: expected {expected}, got {value!r}"
            f" ({type(value).__name__})"
        )

    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError as exc:
                errors.append(exc)
        raise fail(" or ".join(_type_name(a) for a in args))
    if _is_dataclass_type(tp):
        if not isinstance(value, Mapping):
            raise fail(f"a table of {tp.__name__} fields")
        return build_config(tp, value, key, where)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise fail("a list")
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            if len(args) != len(value):
                raise fail(f"a list of {len(args)} items")
            return tuple(
                _coerce(v, a, f"{key}[{i}]", where)
                for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise fail("a table")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, vt, f"{key}.{k}", where) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value or value == member.name:
                return member
        try:  # the enum's own other spellings (its _missing_), e.g. an older name
            return tp(value)
        except ValueError:
            raise fail("one of " + ", ".join(repr(m.value) for m in tp)) from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail("an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise fail("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail("a string")
    if tp is Path or (isinstance(tp, type) and issubclass(tp, Path)):
        if isinstance(value, str | Path):
            return Path(value)
        raise fail("a path string")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise fail(tp.__name__)
    return value


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def build_config(
    cls: type[T], data: Mapping[str, Any], prefix: str = "", where: str | None = None
) -> T:
    """``cls`` from plain data (a TOML table already read); errors name ``prefix.key``."""
    types_ = _field_types(cls)
    for key in data:
        if key not in types_:
            full = f"{prefix}.{key}" if prefix else key
            raise ConfigError(
                f"unknown config key '{full}'{_source(where)}{_closest(key, list(types_))}"
            )
    kwargs = {}
    for name, tp in types_.items():
        full = f"{prefix}.{name}" if prefix else name
        if name in data:
            value = _merged_entries(cls, name, tp, data[name])
            kwargs[name] = _coerce(value, tp, full, where)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            full = f"{prefix}.{missing[0]}" if prefix else missing[0]
            raise ConfigError(f"config key '{full}'{_source(where)} is required") from None
        raise ConfigError(f"config section '{prefix or '<root>'}'{_source(where)}: {exc}") from None
    except (ValueError, AssertionError) as exc:  # __post_init__ validation
        raise ConfigError(f"config section '{prefix or '<root>'}'{_source(where)}: {exc}") from None


def _field_default(cls: Any, name: str) -> Any:
    """The default value of dataclass ``cls``'s field ``name``, or None if it has none."""
    if not _is_dataclass_type(cls):
        return None
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return None if f.default is dataclasses.MISSING else f.default
    return None


def _merged_entries(cls: type, name: str, tp: Any, given: Any) -> Any:
    """For a ``dict[str, <dataclass>]`` field with default entries (named sections such as
    ``stages.256``), the given entries on top of the defaults: a named entry changes only
    the fields it names, the other entries keep their defaults. Anything else: ``given``."""
    args = typing.get_args(tp)
    if (
        typing.get_origin(tp) not in (dict, Mapping)
        or len(args) != 2
        or not _is_dataclass_type(args[1])
        or not isinstance(given, Mapping)
    ):
        return given
    default = _field_default(cls, name)
    if default is None:
        return given
    merged = {key: _plain(entry) for key, entry in default.items()}
    for key, entry in given.items():
        base = merged.get(key)
        both = isinstance(base, dict) and isinstance(entry, Mapping)
        merged[key] = {**base, **entry} if both else entry
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into ``(["a", "b", "c"], value)``.

    The value is read as a TOML value when it parses as one (``3e-4``, ``true``,
    ``[1, 2]``, ``"quoted"``) and as a bare string otherwise (``adamw``, ``runs/x``).
    """
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    path, raw = text.split("=", 1)
    keys = [k.strip() for k in path.strip().split(".")]
    if not all(keys):
        raise ConfigError(f"override '{text}' has an empty key; write section.key=value")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return keys, value


def _apply_override(
    data: dict[str, Any], cls: type, keys: list[str], value: Any, text: str
) -> None:
    """Set ``keys`` in the raw TOML data; a numeric key indexes a list of tables
    (``stages.1.steps=500`` is the second ``[[stages]]`` table's ``steps``)."""
    node: Any = data
    tp: Any = cls
    for depth, key in enumerate(keys):
        full = ".".join(keys[: depth + 1])
        last = depth == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(
                    f"override '{text}': '{full}' needs an index below {len(node)} "
                    f"(the file has {len(node)} entries there)"
                )
            if last:
                node[int(key)] = value
                return
            node, tp = node[int(key)], typing.get_args(tp)[0] if typing.get_args(tp) else Any
            continue
        if typing.get_origin(tp) in (dict, Mapping):  # a named entry: any key is valid
            entry = typing.get_args(tp)[1] if typing.get_args(tp) else Any
            if last and _is_dataclass_type(entry) and not isinstance(value, dict):
                section = ".".join(keys[:depth])
                raise ConfigError(
                    f"override '{text}': '{section}' holds named {entry.__name__} sections; "
                    f"write {section}.<name>.<field>=value"
                )
            if last:
                node[key] = value
                return
            tp = entry
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
            continue
        types_ = _field_types(tp) if _is_dataclass_type(tp) else None
        if types_ is not None and key not in types_:
            raise ConfigError(
                f"unknown config key '{full}' in override '{text}'{_closest(key, list(types_))}"
            )
        if last:
            node[key] = value
            return
        parent, tp = tp, (types_[key] if types_ is not None else Any)
        if typing.get_origin(tp) in (dict, Mapping) and key not in node:
            # One entry set from the command line keeps the others (the field's default).
            node[key] = _plain(_field_default(parent, key) or {})
        child = node.get(key)
        if typing.get_origin(tp) in (list, Sequence) and isinstance(child, list):
            node = child
            continue
        if typing.get_origin(tp) not in (dict, Mapping):
            tp = next((a for a in typing.get_args(tp) if _is_dataclass_type(a)), tp)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> T:
    """Build ``cls`` from a TOML file (optional) and ``section.key=value`` overrides.

    Overrides win over the file; fields absent from both keep their dataclass defaults.
    """
    where = str(path) if path is not None else None
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    for text in overrides:
        keys, value = parse_override(text)
        _apply_override(data, cls, keys, value, text)
    if overrides:
        where = f"{where} + --set overrides" if where else "--set overrides"
    return build_config(cls, data, "", where)


def load_section(
    cls: type[T],
    path: str | Path,
    section: str,
    overrides: Sequence[str] = (),
) -> T:
    """Build ``cls`` from one ``[section]`` table of a TOML file that other tools read too
    (a run file: the trainer reads the job, ``krea2 infra launch`` its ``[launch]``).

    Overrides name the section: ``launch.nodes=16``; one for another section is an error.
    A file without the section gives the dataclass defaults (plus the overrides).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    data = raw.get(section, {})
    if not isinstance(data, dict):
        raise ConfigError(f"config key '{section}' in {p}: expected a table, got {data!r}")
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] != section or len(keys) < 2:
            raise ConfigError(f"override '{text}' must start with '{section}.'")
        _apply_override(data, cls, keys[1:], value, text)
    where = f"{p} + --set overrides" if overrides else str(p)
    return build_config(cls, data, section, where)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    return value


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain TOML-able data (enums by value, paths as strings, None omitted)."""
    return _plain(cfg)


def config_to_toml(cfg: Any) -> str:
    """The config as TOML text that :func:`load_config` reads back to an equal config."""
    return tomli_w.dumps(config_to_dict(cfg))


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write the resolved config next to a run, atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(config_to_toml(cfg))
    tmp.replace(p)
    return p
