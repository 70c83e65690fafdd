"""Name registries for selectors, allocators and data sources, open to other installed packages.

A name resolves, in order, to: a built-in registered with `@register_selector("name")`; a
class advertised in the entry-point group `cluster_repro.selectors` (or
`cluster_repro.allocators`, `cluster_repro.data_sources`) of any installed distribution; or a
`module:Class` path. An unknown name gets a "did you mean" and the list of known names.

A third party's pyproject.toml:

    [project.entry-points."cluster_repro.selectors"]
    my-method = "my_package.selector:MySelector"

The suite's own demo pool is a data source of this kind: this package's pyproject.toml
advertises it in `cluster_repro.data_sources` (repro/demo/source.py, repro/core/sources.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.params import build_params, canonical, describe, params_class

# Packages whose modules register the built-in implementations (each with its own decorator):
# every module of each is imported on first use, so that `import repro` stays light.
_BUILTIN_PACKAGES = {
    "selectors": ["baselines", "method"],
    "allocators": ["method"],
    "data sources": [],  # every one comes through its entry point, the suite's own included
}


class Registry:
    """Maps names to classes of one kind: selectors, allocators or data sources.

    Whatever a name resolves to must be a class with the protocol's method (`select` or
    `allocate`, repro/core/interfaces.py); anything else (a function such as `os:system`, a module
    constant) is refused by `get` before it is called, so a wrong `module:Class` fails with a
    message before any stage runs, never with an AttributeError after one."""

    def __init__(
        self, kind: str, group: str, method: str, protocol: str = "repro/core/interfaces.py"
    ) -> None:
        self.kind = kind
        self.group = group
        self.method = method  # the protocol's method every class of this kind has
        self.protocol = protocol  # the file that states the protocol, for messages
        self._items: dict[str, Any] = {}
        self._from_entry_point: set[str] = set()  # names get() loaded from an entry point
        self._loaded_builtins = False

    def register(self, name: str) -> Callable[[Any], Any]:
        def deco(obj: Any) -> Any:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice ({self._items[name]!r} and {obj!r})"
                )
            self._items[name] = obj
            obj.registry_name = name
            return obj

        return deco

    def _load_builtins(self) -> None:
        if self._loaded_builtins:
            return
        self._loaded_builtins = True
        for name in _BUILTIN_PACKAGES[self.kind]:
            package = importlib.import_module(name)
            for mod in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{name}.{mod.name}")

    def _entry_points(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Built-in and entry-point names, sorted."""
        self._load_builtins()
        return sorted(set(self._items) | set(self._entry_points()))

    def origin(self, name: str) -> str:
        self._load_builtins()
        if name in self._items and name not in self._from_entry_point:
            obj = self._items[name]
            return f"{obj.__module__}:{obj.__qualname__}"
        ep = self._entry_points().get(name)
        if ep is not None:
            dist = getattr(ep, "dist", None)
            return f"{ep.value} (entry point of {dist.name if dist else 'an installed package'})"
        return "?"

    def get(self, name: str) -> Any:
        """The class registered under `name`; raises ConfigError with suggestions if unknown, and
        when the name resolves to something that is not a class with the protocol's method and
        a `Params` dataclass."""
        return self._checked(name, self._resolve(name))

    def _checked(self, name: str, obj: Any) -> Any:
        kind = self.kind[:-1]

        def a(word: str) -> str:
            return ("an " if word[0] in "aeiou" else "a ") + word

        if not (inspect.isclass(obj) and callable(getattr(obj, self.method, None))):
            raise ConfigError(
                f"{name!r} resolves to {obj!r}, not {a(kind)} class: expected a class "
                f"with {a(self.method + '()')} method ({self.protocol})"
            )
        if params_class(obj) is None:
            raise ConfigError(
                f"{kind} {name!r} ({obj.__module__}:{obj.__qualname__}) declares no `Params` "
                f"dataclass: {a(kind)} declares its parameters as one, which the config builder "
                "builds from the config (repro/core/params.py; `@dataclass class Params: pass` "
                "when it takes none)"
            )
        return obj

    def _resolve(self, name: str) -> Any:
        self._load_builtins()
        if name in self._items:
            return self._items[name]
        eps = self._entry_points()
        if name in eps:
            try:
                obj = eps[name].load()
            except Exception as e:  # a broken third-party package: say which one
                raise ConfigError(
                    f"{self.kind[:-1]} {name!r}: entry point {eps[name].value!r} "
                    f"failed to load: {type(e).__name__}: {e}"
                ) from e
            self._items[name] = obj
            self._from_entry_point.add(name)
            return obj
        if ":" in name:
            mod_name, _, attr = name.partition(":")
            try:
                obj = getattr(importlib.import_module(mod_name), attr)
            except (ImportError, AttributeError) as e:
                raise ConfigError(f"{self.kind[:-1]} {name!r}: cannot import: {e}") from e
            except Exception as e:  # noqa: BLE001 - the module itself failed (or an empty name)
                raise ConfigError(f"{self.kind[:-1]} {name!r}: cannot import: {type(e).__name__}: {e}") from e
            return obj
        known = self.names()
        hint = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        extra = f" Did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(
            f"unknown {self.kind[:-1]} {name!r}.{extra} Known: {', '.join(known)}. "
            f"Others can be added by an installed package (entry-point group {self.group!r}) "
            "or named as 'module:Class'."
        )

    def create(self, name: str, params: dict[str, Any], key: str) -> Any:
        """Instantiate `name` with `params`, built into its `Params` dataclass and checked by the
        config builder (repro/core/params.py): a wrong parameter is a ConfigError naming the
        config key."""
        cls = self.get(name)
        self._check_keywords(cls, name, params, key)
        built = build_params(_params(cls), params, key)
        return self._construct(name, key, params, lambda: cls(built))

    def _construct(self, name: str, key: str, params: dict[str, Any], make: Callable[[], Any]) -> Any:
        try:
            return make()
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            if str(e).startswith(key):  # the class already named the key and what is allowed
                raise ConfigError(str(e)) from e
            raise ConfigError(
                f"{key}: {self.kind[:-1]} {name!r} rejected its parameters {params!r}: {e}"
            ) from e

    def _check_keywords(self, cls: Any, name: str, params: dict[str, Any], key: str) -> None:
        """Every key must be a parameter: a field of the class's Params."""
        if not isinstance(params, dict):
            raise ConfigError(f"{key}: expected a mapping of parameter names to values, got {params!r}")
        allowed = [f.name for f in dataclasses.fields(_params(cls))]
        for p in params:
            if p not in allowed:
                hint = difflib.get_close_matches(p, allowed, n=1)
                extra = f"; did you mean {key}.{hint[0]}?" if hint else ""
                raise ConfigError(
                    f"{key}.{p}: {self.kind[:-1]} {name!r} takes no parameter {p!r}{extra} "
                    f"(it takes: {', '.join(allowed) or 'none'})"
                )

    def canonical(self, name: str, params: dict[str, Any], key: str) -> dict[str, Any]:
        """The canonical form of `params` for `name` (repro/core/params.py): built, defaults left
        out. ConfigError as `create`."""
        cls = self.get(name)
        self._check_keywords(cls, name, params, key)
        return canonical(build_params(_params(cls), params, key))

    def params_class(self, name: str) -> type:
        """The `Params` dataclass of `name` (ConfigError as `get`)."""
        return _params(self.get(name))

    def parameters(self, name: str) -> list[str]:
        """One line per parameter of `name` (type, default, range, meaning), for `ls`."""
        return describe(self.params_class(name))


def _params(cls: Any) -> type:
    """The Params of a class `get` returned (it refuses a class without one)."""
    p_cls = params_class(cls)
    assert p_cls is not None, cls
    return p_cls


SELECTORS = Registry("selectors", "cluster_repro.selectors", "select")
ALLOCATORS = Registry("allocators", "cluster_repro.allocators", "allocate")
# The classes a data.sources[].path can name instead of a file (repro/core/sources.py).
DATA_SOURCES = Registry("data sources", "cluster_repro.data_sources", "rows", "repro/core/sources.py")

register_selector = SELECTORS.register
register_allocator = ALLOCATORS.register
