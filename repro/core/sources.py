"""Data sources from plugins: a registered name as `data.sources[i].path`.

A source's path is one of three things, told apart by its spelling alone:

- a `.json` or `.jsonl` file, relative to the data directory (repro/core/data.py reads it);
- a hub dataset, `hf:<id>`;
- anything else: the name of a registered data source (`cluster-repro ls sources`), a class an
  installed package advertises in the entry-point group `cluster_repro.data_sources`
  (repro/core/registry.py), or a `module:Class` path. The suite's generated demo pool is one,
  advertised by this package's own pyproject.toml (repro/demo/source.py).

A registered source's parameters are `data.sources[i].params`, built into the class's `Params`
dataclass like a selector's (repro/core/params.py): typed, range-checked, with a "did you mean"
for an unknown key, and in their canonical form (defaults left out) in the config hash.

What a data source class is (`DataSourcePlugin`): `rows(seed)` gives its rows, which its own
prompt format (`format`) renders; and it declares what the stages would otherwise have to guess
from its name: the paper's domain its rows belong to, whether the run's seed draws them, whether
it gives its own held-out rows, the benchmark that scores those rows, and how many training rows
it gives. Nothing outside the plugin tests for a source's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from repro.core.config.builder import ConfigError

if TYPE_CHECKING:
    from repro.core.prompts import PromptFormat

HUB_PREFIX = "hf:"
FILE_SUFFIXES = (".json", ".jsonl")
WHAT_A_PATH_IS = (
    "a .json / .jsonl file (relative to data_dir), 'hf:<hub id>', or a registered data source "
    "(`cluster-repro ls sources`)"
)


@dataclass
class SourceRows:
    """A data source's rows: JSON-like mappings its `format` renders. `heldout`: the rows it keeps
    out of training itself (a source that declares `own_heldout`); empty for the others, whose
    held-out rows the suite draws (data.heldout_fraction)."""

    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]] = field(default_factory=list)


class DataSource(Protocol):
    """What this module reads of a config's `data.sources[i]` (repro/core/config_schema.py)."""

    path: str
    params: dict[str, Any]
    limit: int | None


class DataSourcePlugin(Protocol):
    """What a registered data source class provides. The registry builds it from its `Params`
    (`cls(params)`, as repro/core/params.py's `Parameterized` does)."""

    Params: ClassVar[type]
    # How its rows become prompt and response when data.sources[i].format is auto (another
    # format name renders its rows with that format instead).
    format: ClassVar[PromptFormat]
    # The paper's domain its rows belong to ("code", "medical"), or None: where the claims'
    # checks read it (repro/core/domains.py); data.domain overrides it.
    domain: ClassVar[str | None]
    # Whether its rows are drawn from the run's seed (then runs of other seeds have other pools
    # and share no feature pass: repro/experiments/sharing.py).
    seeded: ClassVar[bool]
    # Whether it gives its own held-out rows (SourceRows.heldout); then data.heldout_fraction does
    # not split it.
    own_heldout: ClassVar[bool]
    # The registered benchmark (eval.benchmarks) that scores its held-out rows, or None.
    benchmark: ClassVar[str | None]

    def rows(self, seed: int) -> SourceRows:
        """Its rows for a run of seed `seed` (the same seed and params: the same rows)."""
        ...

    def size(self) -> int | None:
        """The training rows it gives, when known without making them (None: not known)."""
        ...


def is_plugin(path: str) -> bool:
    """Whether a source path names a registered data source (not a file, not a hub dataset)."""
    return not path.startswith(HUB_PREFIX) and not path.endswith(FILE_SUFFIXES)


def plugin_class(path: str, key: str) -> Any:
    """The data source class `path` names; ConfigError naming `key` and what a path can be."""
    from repro.core.registry import DATA_SOURCES

    try:
        return DATA_SOURCES.get(path)
    except ConfigError as e:
        raise ConfigError(f"{key}: {path!r}: expected {WHAT_A_PATH_IS}; {e}") from None


def declared(path: str) -> Any | None:
    """The class of a registered source, to read what it declares; None for a file or hub source
    and for a name that does not resolve (preflight and the pool stage name that problem)."""
    if not is_plugin(path):
        return None
    try:
        return plugin_class(path, "data.sources[].path")
    except ConfigError:
        return None


def plugin_of(src: DataSource, i: int) -> Any:
    """The data source `data.sources[i]` names, built from its params; ConfigError naming the key
    (its path, or the parameter) and what is allowed."""
    from repro.core.registry import DATA_SOURCES

    plugin_class(src.path, f"data.sources[{i}].path")
    return DATA_SOURCES.create(src.path, src.params, f"data.sources[{i}].params")


def canonical_params(src: DataSource, i: int) -> dict[str, Any]:
    """A source's params in their canonical form (built, defaults left out) for the config hash;
    as written where its class refuses them or cannot be found (such a config never runs:
    preflight names the problem, and its hash only has to be stable)."""
    if not is_plugin(src.path):
        return dict(src.params)
    from repro.core.registry import DATA_SOURCES

    try:
        return DATA_SOURCES.canonical(src.path, src.params, f"data.sources[{i}].params")
    except ConfigError:
        return dict(src.params)


def training_rows(src: DataSource, i: int) -> int | None:
    """The training rows a registered source gives (after its `limit`), when it says without
    making them; None for files and hub datasets, and where it cannot be built."""
    if not is_plugin(src.path):
        return None
    try:
        n = plugin_of(src, i).size()
    except ConfigError:
        return None
    if n is None:
        return None
    return n if src.limit is None else min(n, src.limit)


def source_name(path: str) -> str:
    """What a registered source's examples are named by (their ids, `Example.source`): its name,
    or for `module:Class` the class's."""
    return path.rpartition(":")[2]
