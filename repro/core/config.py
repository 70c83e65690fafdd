"""One typed config for every stage, loaded from YAML and `key.sub=value` overrides.

Validation happens at load time: an unknown key gets a "did you mean", a wrong type or value
names the key and what is allowed. The config is three modules with one job each, and this one
loads it:

    repro/core/config_schema.py   the sections (dataclasses) and the run's hash
    repro/core/builder.py         building any dataclass from a mapping; YAML; overrides; ranges
    repro/core/checks.py          the ranges of every number and the checks across keys

Their names are importable from here, as before.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any

import yaml

from repro.core.builder import (  # noqa: F401 (re-exported)
    NAME_MAX_BYTES,
    ConfigError,
    Range,
    build,
    check_name,
    check_numbers,
    check_text,
    check_texts,
    numeric_keys,
    parse_override,
    read_yaml_file,
    set_dotted,
)
from repro.core.checks import NUMERIC_RANGES, validate  # noqa: F401 (re-exported)
from repro.core.config_schema import (  # noqa: F401 (re-exported)
    AllocationConfig,
    DataConfig,
    DataSource,
    EvalConfig,
    ExperimentConfig,
    LaunchConfig,
    LoraConfig,
    ModelConfig,
    PromptFormatName,
    SelectionConfig,
    TrainConfig,
    _short_hash,
    config_hash,
    eval_hash,
    resolve_data_dir,
)
from repro.core.steps import Derived, derive, grad_accum  # noqa: F401 (re-exported)

# The configs the package ships (experiment configs, run lists, grids, cluster profiles). They live
# inside the package so that an installed wheel has them; the repository's top-level `configs` is a
# link to this folder, so the documented `configs/...` paths work in a checkout.
SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def shipped_configs() -> list[str]:
    """The name of every shipped config: its path under SHIPPED_CONFIGS without `.yaml`, sorted
    (`demo`, `runs/demo-grid`, `grids/paper`, `clusters/local`, ...)."""
    return sorted(
        p.relative_to(SHIPPED_CONFIGS).with_suffix("").as_posix() for p in SHIPPED_CONFIGS.rglob("*.yaml")
    )


def resolve_config_path(path: str | os.PathLike[str], what: str = "config file") -> Path:
    """The file `path` names: a file that exists wins; else, for a relative path, the shipped
    config of that name (`demo`, `demo.yaml`, `runs/demo-grid`, or the checkout's spelling
    `configs/runs/demo-grid.yaml`), so every shipped config works from any directory and from an
    installed wheel. Otherwise ConfigError naming `path` (`what` says what kind of file), with a
    "did you mean" and the shipped names."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_absolute():
        name = p.as_posix().removesuffix(".yaml")
        if name.startswith("configs/"):
            name = name[len("configs/") :]
        shipped = SHIPPED_CONFIGS / f"{name}.yaml"
        if ".." not in Path(name).parts and shipped.is_file():
            return shipped
    names = shipped_configs()
    hint = difflib.get_close_matches(
        p.as_posix().removesuffix(".yaml").removeprefix("configs/"), names, n=1, cutoff=0.6
    )
    raise ConfigError(
        f"{what} {str(path)!r} not found: no such file, nor a shipped config of "
        f"that name{f'; did you mean {hint[0]!r}?' if hint else ''} (shipped: "
        f"{', '.join(names)}; `cluster-repro ls configs` describes them)"
    )


def from_dict(
    data: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (), source: str = "<dict>"
) -> ExperimentConfig:
    """Build and validate a config from a mapping plus `key=value` overrides."""
    data = copy.deepcopy(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    for ov in overrides:
        k, v = parse_override(ov)
        set_dotted(data, k, v)
    return build(ExperimentConfig, data, source, validate)


def load_config(
    path: str | os.PathLike[str] | None, overrides: list[str] | tuple[str, ...] = ()
) -> ExperimentConfig:
    """Load a YAML config file, or a shipped config by name (`resolve_config_path`), or the
    defaults when `path` is None, and apply overrides."""
    if path is None:
        return from_dict({}, overrides, source="<defaults>")
    p = resolve_config_path(path)
    data = read_yaml_file(p, "config file") or {}
    return from_dict(data, overrides, source=str(p))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    from repro.core.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
