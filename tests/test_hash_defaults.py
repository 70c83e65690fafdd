"""The config hash leaves out every value equal to its default (repro/core/config/schema.py), so a
changed default would change what a config that leaves it out runs, under the same hash. Each hash
carries the version of its defaults: this test holds the defaults of the current versions
(tests/golden/hash_defaults.json) and fails when one changes without a bump of its version.

Record the defaults after a bump, or after adding or removing a key (which needs no bump: a key
at its default is left out):  python -m tests.test_hash_defaults --write
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from repro.core.config import schema as config_schema
from repro.core.config.load import from_dict
from repro.core.config.schema import ExperimentConfig, eval_hash
from repro.core.params import canonical_form, field_default, params_class
from repro.core.registry import ALLOCATORS, DATA_SOURCES, SELECTORS

GOLDEN = Path(__file__).parent / "golden" / "hash_defaults.json"
WRITE = "python -m tests.test_hash_defaults --write"


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """dotted key -> default of every leaf of the dataclass instance `obj` (a list of sections,
    data.sources: its default as a whole and its items' keys as `sources[].key`, "(required)"
    for a key without a default)."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key, tp = getattr(obj, f.name), f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(value):
            out.update(_leaves(value, key + "."))
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            out[key] = _json([dataclasses.asdict(v) for v in value])
            item = typing.get_args(tp)[0]
            for g in dataclasses.fields(item):
                default = field_default(item, g.name)
                out[f"{key}[].{g.name}"] = "(required)" if default is dataclasses.MISSING else _json(default)
        else:
            out[key] = _json(value)
    return out


OWN = {"repro", "method", "baselines"}  # the suite's own packages


def _builtin_params() -> dict[str, Any]:
    """`selectors.<name>.<param>` (and allocators, data sources) -> the default of every
    built-in's Params: the suite's own, the demo's data source among them (found through this
    package's entry point, like any installed package's)."""
    out = {}
    for reg in (SELECTORS, ALLOCATORS, DATA_SOURCES):
        for name in reg.names():
            if reg.get(name).__module__.split(".")[0] not in OWN:  # another package's business
                continue
            p_cls = params_class(reg.get(name))
            assert p_cls is not None, name
            out.update(_leaves(p_cls(), f"{reg.kind}.{name}."))
    return out


def current() -> dict[str, Any]:
    """The defaults each hash leaves out, with the version they are recorded under."""
    hashed = {
        k: v
        for k, v in _leaves(ExperimentConfig()).items()
        if not any(k == x or k.startswith(x + ".") for x in config_schema._HASH_EXCLUDED)
    }
    return {
        "config": {
            "version": config_schema.CONFIG_HASH_VERSION,
            "defaults": {**hashed, **_builtin_params()},
        },
        "eval": {"version": config_schema.EVAL_HASH_VERSION, "defaults": _leaves(config_schema.EvalConfig())},
    }


def test_a_changed_default_comes_with_a_bump_of_its_hash_version() -> None:
    recorded, now = json.loads(GOLDEN.read_text()), current()
    names = {"config": "CONFIG_HASH_VERSION", "eval": "EVAL_HASH_VERSION"}
    for which, name in names.items():
        old, new = recorded[which]["defaults"], now[which]["defaults"]
        both = sorted(old.keys() & new.keys())
        changed = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in both if old[k] != new[k]]
        assert not changed or now[which]["version"] != recorded[which]["version"], (
            f"a default changed without a bump of {name} (repro/core/config/schema.py), so configs "
            f"that leave it out would run otherwise under their old hash: {'; '.join(changed)}. "
            f"Bump {name}, then {WRITE}"
        )
        assert now[which]["version"] >= recorded[which]["version"], f"{name} went down"
    assert now == recorded, (
        f"the defaults or versions differ from {GOLDEN.name}: {WRITE} (a key added or removed "
        "needs no bump: a value at its default is left out of the hash)"
    )


def _other(value: Any, tp: Any) -> Any:
    """A value of type `tp` that is not `value` (whether the config would accept it or not: the
    hash does not validate)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Literal:
        return next(a for a in args if a != value)
    if type(None) in args:  # optional: its other type
        if value is not None:
            return None
        tp = next(a for a in args if a is not type(None))
        some = {int: 0, float: 0.0, str: "", bool: False, dict: {}}
        return _other(some.get(typing.get_origin(tp) or tp), tp)
    if tp is bool:
        return not value
    if tp in (int, float):
        return value + 1
    if tp is str:
        return value + "-x"
    if typing.get_origin(tp) is list:
        return [*value, "x"]
    if typing.get_origin(tp) is dict:
        return {**value, "x": 1}
    raise AssertionError(f"no other value for {tp}")


def _sections() -> list[tuple[str, Any, str, Any]]:
    """(section path, section class, field name, field type) of every leaf of the config."""
    out = []

    def walk(cls: type, path: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{path}{f.name}.")
            elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                walk(typing.get_args(tp)[0], f"{path}{f.name}[0].")
            else:
                out.append((path, cls, f.name, tp))

    walk(ExperimentConfig, "")
    return out


def _set(cfg: Any, dotted: str, value: Any) -> Any:
    """A copy of the config with `dotted` (sections, `name[0]` for a list's first item) set."""
    head, _, rest = dotted.partition(".")
    if head.endswith("[0]"):
        items = list(getattr(cfg, head[:-3]))
        items[0] = _set(items[0], rest, value)
        return dataclasses.replace(cfg, **{head[:-3]: items})
    return dataclasses.replace(cfg, **{head: _set(getattr(cfg, head), rest, value) if rest else value})


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part[:-3])[0] if part.endswith("[0]") else getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("path, cls, name, tp", _sections(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_key_is_in_its_hash_once_it_differs_from_its_default(path, cls, name, tp) -> None:
    """Written out at its default, a key is the same run as left out; any other value is another
    run, for the keys that change training (config_hash) and the eval's (eval_hash); the keys
    that change neither are in neither."""
    base = from_dict(BASE, source="test")
    key = f"{path}{name}"
    spelled = from_dict(_merged(BASE, _nested(key, _json(_get(base, key)))), source="test")
    assert (spelled.hash(), eval_hash(spelled)) == (base.hash(), eval_hash(base)), key
    other = _set(base, key, _other(_get(base, key), tp))
    if path == "eval.":
        assert other.hash() == base.hash() and eval_hash(other) != eval_hash(base), key
    elif any(key == x or key.startswith(x + ".") for x in config_schema._HASH_EXCLUDED):
        assert other.hash() == base.hash() and eval_hash(other) == eval_hash(base), key
    else:
        assert other.hash() != base.hash() and eval_hash(other) == eval_hash(base), key


# The config every key is varied from: the defaults, with the one data source a config needs (a
# file's path, so the hash reads no registry).
BASE: dict[str, Any] = {"data": {"sources": [{"path": "pool.jsonl"}]}}


def _merged(base: Any, over: Any) -> Any:
    """`over` laid on `base`: mappings key by key, a list's first item on the base's first."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base[k], v) if k in base else v for k, v in over.items()}}
    if isinstance(base, list) and isinstance(over, list) and base and over:
        return [_merged(base[0], over[0]), *base[1:]]
    return over


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": value}} for "a.b" (a list's first item: a list of one mapping)."""
    head, _, rest = dotted.partition(".")
    inner = _nested(rest, value) if rest else value
    return {head[:-3]: [inner]} if head.endswith("[0]") else {head: inner}


def test_a_changed_default_without_the_bump_would_keep_the_hash(monkeypatch) -> None:
    """Why the version is part of the hash: a value at its default is left out, so a section whose
    default changed gives a config of the new default the canonical form the old default had;
    the bump changes every hash (config_hash's alone for its version, eval_hash's for its)."""

    @dataclasses.dataclass
    class Before:
        lr: float = 2e-4

    @dataclasses.dataclass
    class After:
        lr: float = 1e-3

    assert canonical_form(Before()) == canonical_form(After(lr=1e-3)) == {}
    assert canonical_form(After(lr=2e-4)) == {"lr": 2e-4}
    base = from_dict({"train": {"lr": 1e-3}, "eval": {"limit": 5}}, source="test")
    old = (base.hash(), eval_hash(base))
    monkeypatch.setattr(config_schema, "CONFIG_HASH_VERSION", config_schema.CONFIG_HASH_VERSION + 1)
    assert base.hash() != old[0] and eval_hash(base) == old[1]
    monkeypatch.setattr(config_schema, "EVAL_HASH_VERSION", config_schema.EVAL_HASH_VERSION + 1)
    assert eval_hash(base) != old[1]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {WRITE}")
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
