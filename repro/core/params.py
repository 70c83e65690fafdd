"""Typed parameters of selectors and allocators: each declares a `Params` dataclass.

    @register_selector("loss")
    class LossSelector(Parameterized):
        @dataclass
        class Params:
            score: Literal["loss", "el2n"] = param("loss", help="what to rank by")
            batch_size: int = param(8, lo=1, help="examples per forward pass")

The config's `selection.params` (or `allocation.params`) mapping is built into that dataclass by
the config builder (repro/core/config/builder.py): the same type coercion (an int where a float is
asked becomes a float), ranges, "did you mean" for an unknown key, and defaults in one place. A
`check()` method on the dataclass states what types and ranges cannot (two keys together), raising
ConfigError. The parameters read as the object's attributes (`self.score` is
`self.params.score`).

The *canonical* form of a mapping is its built values with the defaults left out (JSON-able;
`canonical_form`, the config's sections' rule too, repro/core/config/schema.py): `{ratio: 50}`,
`{ratio: 50.0}` and `{}` are one canonical form when 50 is the default. The config hash and the
result rows' `selection_params` / `allocation_params` take it, so two spellings of one experiment
are one run, and a new parameter whose default keeps the old behaviour changes no run's hash.

A class without a `Params` dataclass is refused by the registry, naming what to add.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, ClassVar

from repro.core.config.builder import ConfigError, Range, _build, _type_name, check_numbers


def param(
    default: Any,
    *,
    help: str = "",
    lo: float | None = None,
    hi: float | None = None,
    lo_incl: bool = True,
    hi_incl: bool = True,
    note: str = "",
) -> Any:
    """A parameter field: its default, what it means (`help`, shown by `cluster-repro ls`) and the
    range a number must be in (`lo`/`hi`, inclusive unless `*_incl` is false; `note` joins the
    error message)."""
    bounded = lo is not None or hi is not None
    meta = {"help": help, "range": Range(lo, hi, lo_incl, hi_incl, note) if bounded else None}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def params_class(cls: Any) -> type | None:
    """The class's `Params` dataclass, or None where it declares none."""
    p = getattr(cls, "Params", None)
    return p if isinstance(p, type) and dataclasses.is_dataclass(p) else None


def build_params(p_cls: type, data: dict[str, Any] | None, key: str) -> Any:
    """The Params instance of a mapping; ConfigError naming `key.<name>` and what is allowed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: expected a mapping of parameter names to values, got {data!r}")
    obj = _build(p_cls, copy.deepcopy(data), key)
    ranges = {f.name: f.metadata["range"] for f in dataclasses.fields(p_cls) if f.metadata.get("range")}
    check_numbers(obj, ranges, where=f"{key}.")
    check = getattr(obj, "check", None)
    if callable(check):
        try:
            check()
        except ConfigError as e:  # "name: what" -> "selection.params.name: what"
            if str(e).startswith(f"{key}."):  # it names its full key already (a missing extra)
                raise
            head = str(e).partition(": ")[0]
            names = {f.name for f in dataclasses.fields(p_cls)}
            raise ConfigError(f"{key}.{e}" if head in names else f"{key}: {e}") from None
    return obj


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default value (MISSING when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def field_default(cls: type, name: str) -> Any:
    """The default of the dataclass `cls`'s field `name`."""
    return _default(next(f for f in dataclasses.fields(cls) if f.name == name))


def canonical_form(obj: Any) -> Any:
    """A dataclass instance (Params, a config section) as JSON-able data without the values at
    their defaults: a nested dataclass, or a list of them (data.sources), in its own canonical
    form, any other value as it is, and a field left out where that equals its default's (of
    the same type)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value, default = getattr(obj, f.name), _default(f)
            form = canonical_form(value)
            if form != canonical_form(default) or type(value) is not type(default):
                out[f.name] = form
        return out
    if isinstance(obj, list):
        return [canonical_form(v) for v in obj]
    return copy.deepcopy(obj)


def canonical(obj: Any) -> dict[str, Any]:
    """A Params instance as a mapping without the fields at their defaults."""
    out: dict[str, Any] = canonical_form(obj)
    return out


def describe(p_cls: type) -> list[str]:
    """One line per parameter: name, type, default, range and help (for `cluster-repro ls`)."""
    hints = typing.get_type_hints(p_cls)
    lines = []
    for f in dataclasses.fields(p_cls):
        default = _default(f)
        rng = f.metadata.get("range")
        tp = hints[f.name]
        args = typing.get_args(tp) if typing.get_origin(tp) is not None else (tp,)
        what = rng.describe(int in args, type(None) in args) if rng is not None else _type_name(tp)
        help_ = f.metadata.get("help", "")
        lines.append(f"{f.name} = {default!r}  ({what}){': ' + help_ if help_ else ''}")
    return lines


class Parameterized:
    """The base of a selector or allocator with a `Params` dataclass.

    Built from a Params instance (what the registry passes) or from keywords (what code and
    tests write: `LossSelector(score="el2n")`), checked the same way either way. The parameters
    read as attributes."""

    Params: ClassVar[type]
    # The config key the parameters come from, for messages.
    params_key: ClassVar[str] = "selection.params"

    def __init__(self, params: Any = None, /, **kw: Any) -> None:
        p_cls = type(self).Params
        if params is None:
            params = build_params(p_cls, kw, self.params_key)
        elif kw or not isinstance(params, p_cls):
            raise TypeError(f"{type(self).__name__}: pass one {p_cls.__qualname__} or keywords, not both")
        self.params = params
        self.setup()

    def setup(self) -> None:
        """What a class derives from its parameters once (optional)."""

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the object does not have: its parameters.
        params = self.__dict__.get("params")
        if params is not None and name in {f.name for f in dataclasses.fields(params)}:
            return getattr(params, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
