"""The one way a typed settings object is built from YAML: dataclasses, their annotations, ranges.

Every config of the suite (an experiment, a cluster profile, a selector's or allocator's
parameters) is a dataclass built here by one set of rules: an unknown key gets a "did you mean",
every value is checked against its annotation (int, float, bool, str, Literal, Optional, lists,
nested sections; an int becomes a float where a float is asked), numbers against their `Range`,
strings for control characters. Every error is a ConfigError that names the file or key and
what was expected. YAML files are read with duplicate keys refused; `key.sub=value` overrides are
parsed here too.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from repro.core.errors import UserError


class ConfigError(UserError, ValueError):
    """A user's config is wrong; the message names the key (and file) and what was expected."""


# ----------------------------------------------------------------------------- building


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)`, worked out once per class: the annotations are strings
    (`from __future__ import annotations`), compiled and evaluated at every call, and every
    config built, checked or hashed reads them for each of its sections. Read-only."""
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> typing.TypeGuard[type]:
    """An annotation that is a dataclass (a config section), not an instance of one."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(inner)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if _is_dataclass_type(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints become floats where asked)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass  # try the next member; the message below names them all
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        hint = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{key}: {value!r} is not allowed; expected {_type_name(tp)}{extra}")
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer with hundreds of digits
                raise ConfigError(
                    f"{key}: expected a finite number, got an integer of {len(str(value))} digits"
                ) from None
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # a bug in this file, not the user's


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            extra = f"; did you mean {(prefix + '.' if prefix else '') + hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown key {full!r}{extra} (allowed here: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], full)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in kwargs:
            full = f"{prefix}.{f.name}" if prefix else f.name
            raise ConfigError(
                f"{full}: required, and not given (given: {', '.join(map(str, data)) or 'nothing'})"
            )
    return cls(**kwargs)


def set_dotted(d: dict[str, Any], dotted: str, value: Any, where: str = "override") -> None:
    """d["a"]["b"]["c"] = value for dotted "a.b.c", creating sections on the way. A part may
    index an item of a list that is there (`data.sources[0].params.train_size`). ConfigError
    (prefixed by `where`) when a part on the way is a value, not a section, or names an item the
    list does not have."""
    parts = dotted.split(".")
    cur: Any = d
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        m = re.fullmatch(r"(.+)\[(\d+)\]", part)
        if m is None:
            if last:
                cur[part] = value
                return
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"{where} {dotted!r}: {part!r} is not a section")
            cur = nxt
            continue
        name, index = m.group(1), int(m.group(2))
        items = cur.get(name)
        if not isinstance(items, list) or index >= len(items):
            has = f"has {len(items)} item(s)" if isinstance(items, list) else "is not a list here"
            raise ConfigError(
                f"{where} {dotted!r}: {name!r} {has}; an override changes an item that is there "
                f"(to add one, set the whole list: {'.'.join([*parts[:n], name])}=[...])"
            )
        if last:
            items[index] = value
            return
        if not isinstance(items[index], dict):
            raise ConfigError(f"{where} {dotted!r}: {part!r} is not a section")
        cur = items[index]


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: `train: {lr: 1}` then `train: {lr: 2}` would train with 2 and say nothing)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: overriding is its point
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise _DuplicateKey(
                    f"line {key_node.start_mark.line + 1}: key {key!r} is given "
                    f"twice (first on line {first.line + 1}); keep one"
                )
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(yaml.YAMLError):
    """A mapping gives one key twice (the message says where)."""


def read_yaml_file(path: str | os.PathLike[str], what: str, hint: str = "") -> Any:
    """The parsed YAML of a file (None for an empty one); ConfigError naming the file when it is
    missing (`what` names the kind of file, `hint` is appended), not UTF-8 text, not valid YAML,
    or gives one key twice in a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} not found{hint}")
    try:
        return yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); expected a YAML {what}") from None
    except _DuplicateKey as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-4` -> ("train.lr", 0.0001). Values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    # YAML would fold a raw newline into a space, silently changing the value (a path, a name).
    check_text(text, f"override {key}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # YAML 1.1 reads "1e-4" as a string; numbers in scientific notation are common in configs.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key, value


# ----------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """The numbers one key allows: bounds `lo`/`hi` (None: unbounded; `*_incl`: the bound itself
    is allowed) and a note for the message. Whether null is allowed is the field's annotation's
    business (`int | None`), not the range's."""

    lo: float | None = None
    hi: float | None = None
    lo_incl: bool = True
    hi_incl: bool = True
    note: str = ""

    def allows(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v < self.lo or (v == self.lo and not self.lo_incl)):
            return False
        return self.hi is None or not (v > self.hi or (v == self.hi and not self.hi_incl))

    def describe(self, integer: bool, nullable: bool = False) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        what = "an integer" if integer else "a finite number"
        if self.lo is not None and self.hi is not None:
            what += (
                f" in {'[' if self.lo_incl else '('}{num(self.lo)}, {num(self.hi)}"
                f"{']' if self.hi_incl else ')'}"
            )
        elif self.lo is not None:
            what += f" {'>=' if self.lo_incl else '>'} {num(self.lo)}"
        elif self.hi is not None:
            what += f" {'<=' if self.hi_incl else '<'} {num(self.hi)}"
        if nullable:
            what += " or null"
        return what + (f" ({self.note})" if self.note else "")


# Names become folder names (`<output_dir>/<name>/`) and SLURM job names: at most this many bytes.
NAME_MAX_BYTES = 200


def _union_args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _is_numeric(tp: Any) -> bool:
    """An annotation that allows an int or a float (alone, or in a union with null or others,
    e.g. `int | dict[str, int] | None`: the range applies when the value is a number)."""
    return any(a in (int, float) for a in _union_args(tp))


def check_numbers(obj: Any, ranges: dict[str, Range], where: str = "") -> None:
    """ConfigError (prefixed by `where`) for the first numeric field of the dataclass `obj` whose
    value is a number outside its range in `ranges` (keys as `numeric_keys` names them; a field
    without an entry is only checked to be finite), or not finite."""
    for key, pat, value, tp in _fields(obj):
        if not _is_numeric(tp) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # null, or the non-numeric side of a union (checked elsewhere)
        rng = ranges.get(pat, Range())
        if not rng.allows(value):
            args = _union_args(tp)
            raise ConfigError(
                f"{where}{key}: expected {rng.describe(int in args, type(None) in args)}, got {value!r}"
            )


def _list_item_dataclass(tp: Any) -> Any:
    """The dataclass of a `list[SomeDataclass]` annotation, else None."""
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if dataclasses.is_dataclass(inner):
            return inner
    return None


def numeric_keys(cls: type, prefix: str = "") -> list[str]:
    """The range keys (as a ranges table names them: dotted, `[]` for every item of a list) of
    every field of the dataclass `cls` that takes a number."""
    hints = type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            out += numeric_keys(tp, key + ".")
        elif _list_item_dataclass(tp) is not None:
            out += numeric_keys(_list_item_dataclass(tp), key + "[].")
        elif _is_numeric(tp):
            out.append(key)
    return out


def _fields(obj: Any, prefix: str = "", pattern: str = "") -> typing.Iterator[tuple[str, str, Any, Any]]:
    """(key as the user writes it, NUMERIC_RANGES key, value, annotation) of every leaf field,
    sections and lists of sections walked into (data.sources[1].limit)."""
    cls: type = type(obj)
    hints = type_hints(cls)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key, pat = f"{prefix}{f.name}", f"{pattern}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _fields(value, key + ".", pat + ".")
        elif _list_item_dataclass(hints[f.name]) is not None:
            for i, item in enumerate(value):
                yield from _fields(item, f"{key}[{i}].", pat + "[].")
        else:
            yield key, pat, value, hints[f.name]


def _control_chars(text: str) -> list[str]:
    """The control characters in `text` (newline, tab, NUL, ...; also U+2028/U+2029, which some
    tools read as line breaks), as escapes like '\\n'."""
    bad = {c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")}
    return sorted(repr(c)[1:-1] for c in bad)


def check_text(value: str, key: str) -> None:
    """ConfigError when a setting holds control characters: a newline in a value that reaches a
    shell or sbatch file becomes a line of its own (an extra `#SBATCH` directive)."""
    bad = _control_chars(value)
    if bad:
        raise ConfigError(
            f"{key}: {value!r} contains control characters ({', '.join(bad)}); "
            "write it on one line, without tabs or other control characters"
        )


def check_name(value: str, key: str = "name") -> None:
    """ConfigError unless `value` is usable as one folder name and a job name: not empty, no path
    separator, no '..', no control characters, at most NAME_MAX_BYTES bytes."""
    why = None
    if not value.strip():
        why = "it is empty"
    elif "/" in value or "\\" in value:
        why = "it contains a path separator ('/' or '\\'), so it would nest or escape folders"
    elif ".." in value or value == ".":
        why = "it contains '..' (or is '.'), so it could name a folder outside output_dir"
    elif _control_chars(value):
        why = f"it contains control characters ({', '.join(_control_chars(value))})"
    elif len(value.encode("utf-8")) > NAME_MAX_BYTES:
        why = f"it is {len(value.encode('utf-8'))} bytes long"
    if why:
        raise ConfigError(
            f"{key}: {value!r} is not allowed: {why}. It becomes a folder name and a "
            f"job name: use letters, digits, '-', '_' and '.' (at most "
            f"{NAME_MAX_BYTES} bytes, no '/' and no '..')"
        )


def check_texts(obj: Any, where: str = "", skip: tuple[str, ...] = ()) -> None:
    """ConfigError (prefixed by `where`) for the first string of the dataclass `obj` (fields,
    list items, mapping keys and values; fields named in `skip` left out) that holds control
    characters."""

    def walk(value: Any, key: str) -> None:
        if isinstance(value, str):
            check_text(value, key)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(str(k), f"{key} (key {k!r})")
                walk(v, f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    try:
        for key, _, value, _ in _fields(obj):
            if key not in skip:
                walk(value, key)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None


T = typing.TypeVar("T")


def build(cls: type[T], data: Any, source: str, validate: typing.Callable[[T], None] | None = None) -> T:
    """The dataclass `cls` (a config of any kind: an experiment, a cluster profile) from a
    mapping, by one set of rules: an unknown key gets a "did you mean", every value is checked
    against its annotation (int, float, bool, str, Literal, Optional, lists, nested sections),
    then `validate` runs the checks the types cannot say. Every error starts with `source` (the
    file) and names the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        obj = _build(cls, copy.deepcopy(data))
        if validate is not None:
            validate(obj)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return obj
