"""The claims file (reports/claims/claims.yaml): its keys, checked as it is loaded (`load_claims`), into
`Claim`s of `Check`s. A malformed entry raises ClaimsFileError naming the file, the claim (its
id), the key and what was expected. reports/claims/verdicts.py evaluates the checks.
"""

from __future__ import annotations

import difflib
import functools
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reports.runs import DOMAINS, ReportInputError
from repro.core.config.builder import ConfigError
from repro.core.config.schema import AllocationConfig
from repro.core.domains import dataset_domain, source_stem
from repro.core.params import build_params, params_class
from repro.core.protocols import PROTOCOLS
from repro.core.registry import ALLOCATORS, SELECTORS, Registry

CLAIMS_FILE = Path(__file__).resolve().parent / "claims.yaml"
VERDICTS = ("consistent", "not reproduced", "inconclusive", "diverged", "not run")
METRICS = ("quality", "train_time_ratio", "time_vs_predicted", "time_per_padded_token", "purity")
DIRECTIONS = ("not_worse", "better", "below", "at_least")
CELL_KEYS = {
    "method",
    "ratio",
    "weight_mode",
    "selection_params",
    "allocation_params",
    "allocator",
    "world_size",
}
REF_KEYS = CELL_KEYS | {"match"}
MATCHES = ("count", "compute")
CHECK_KEYS = {
    "id",
    "cell",
    "reference",
    "metric",
    "direction",
    "tolerance",
    "threshold",
    "paper_setting",
    "protocol",
    "domain",
    "paper_value",
    "note",
}
TOLERANCE_KEYS = {"points", "loss_share", "random_share", "reason"}
# A check's `domain: any`: it applies to a pool of any domain (C6: clusters against categories).
ANY_DOMAIN = "any"
CLAIM_KEYS = {"id", "title", "words", "paper", "checks"}
TOP_KEYS = {"source", "shared", "claims"}
# CluSTER's main setting, where a check's cell leaves it open: the default within-cluster choice
# (prune close, the paper's "peripheral"), the cluster-interleave allocator, rank weights, no
# allocation params (plain batches, not token-balanced).
CLUSTER_DEFAULTS = {"prune": "close"}
CPU_NOTE = "CPU scale: evidence about the mechanism, not the 7B result"
HELDOUT = ("heldout", "loss")
# The method of `cluster-repro eval --model M` rows: the model before fine-tuning (no selector).
BASE_METHOD = "base"
WEIGHT_MODES = typing.get_args(typing.get_type_hints(AllocationConfig)["weight_mode"])
# A reference found by its setting and seed alone (full data, the base model) or by the cell's
# kept count or cost (`match`): any other key would be ignored, so it is refused.
PLAIN_REF_KEYS = {"method", "match"}


class ClaimsFileError(ReportInputError):
    """A malformed claims file: the message names the file, the entry (claim/check id), the key
    and what was expected."""


# ----------------------------------------------------------------------------- the claims file


@dataclass(frozen=True)
class Check:
    claim: str
    id: str
    cell: dict[str, Any]
    reference: dict[str, Any] | None
    metric: str
    direction: str
    tolerance: dict[str, Any] | None = None
    threshold: dict[str, Any] | None = None
    paper_setting: dict[str, str] | None = None
    protocol: str | None = None
    domain: str | None = None
    paper_value: str = ""
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.claim}/{self.id}"

    @property
    def applies_to(self) -> str | None:
        """The domain of the pools this check applies to: its `domain`, else its paper
        setting's dataset's (repro/core/domains.py); None: any pool (`domain: any`, or a check
        that names neither)."""
        if self.domain == ANY_DOMAIN:
            return None
        if self.domain is not None:
            return self.domain
        if self.paper_setting is not None:
            return dataset_domain(source_stem(self.paper_setting["dataset"]))
        return None


@dataclass(frozen=True)
class Claim:
    id: str
    title: str
    words: str
    paper: str
    checks: tuple[Check, ...]


def _need(cond: bool, where: str, key: str, expected: str, got: Any) -> None:
    if not cond:
        raise ClaimsFileError(f"{where}: key {key!r}: expected {expected}, got {got!r}")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


def _known(value: Any, known: list[str] | tuple[str, ...], where: str, key: str, what: str) -> None:
    """ClaimsFileError naming the key, what is known and the nearest name, unless value is known."""
    if value in known:
        return
    near = difflib.get_close_matches(str(value), [str(k) for k in known], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ClaimsFileError(f"{where}: key {key!r}: expected {what} ({', '.join(known)}), got {value!r}{hint}")


def _resolved(registry: Registry, name: str, where: str, key: str) -> type:
    """The class `name` names (a registered or entry-point name, or module:Class)."""
    if ":" not in name:
        _known(name, registry.names(), where, key, f"a known {registry.kind[:-1]}")
    try:
        return registry.get(name)
    except ConfigError as e:
        raise ClaimsFileError(f"{where}: key {key!r}: {e}") from None


def _params_checked(cls: type, params: dict[str, Any], where: str, key: str) -> set[str]:
    """The names of cls's parameters (its Params' fields), after checking `params` against them
    as a config's are (names, types, ranges)."""
    p_cls = params_class(cls)
    assert p_cls is not None, cls  # the registry refuses a class without Params
    try:
        build_params(p_cls, params, key)
    except ConfigError as e:
        raise ClaimsFileError(f"{where}: {e}") from None
    return {f.name for f in fields(p_cls)}


def _names_known(d: dict[str, Any], where: str, key: str) -> None:
    """The spec's method, allocator, weight mode and parameters are what the suite knows: a typo
    would match no run, and the check would read `not run` forever."""
    method = d["method"]
    if method == BASE_METHOD:
        extra = sorted(set(d) - {"method", "world_size"})
        _need(not extra, where, f"{key}.{extra[0] if extra else ''}", "no settings for the base model", d)
        return
    if ":" not in method:
        _known(method, [*SELECTORS.names(), BASE_METHOD], where, f"{key}.method", "a known method")
    cls = _resolved(SELECTORS, method, where, f"{key}.method")
    takes = _params_checked(cls, d.get("selection_params") or {}, where, f"{key}.selection_params")
    if "ratio" in d:
        _need("ratio" in takes, where, f"{key}.ratio", f"no ratio ({method} has none)", d["ratio"])
    if "match" in d:  # a run at the cell's kept count or cost: its selector takes a budget
        _need(
            bool(getattr(cls, "takes_budget", True)),
            where,
            f"{key}.method",
            f"a method that takes a budget (selection.n) to be matched; {method} sets its own kept count",
            method,
        )
    elif method != "full":  # found as a cell is: by its ratio
        _need(
            "ratio" in takes,
            where,
            f"{key}.method",
            "full, base or a method with a ratio: the report keys other methods' runs by their kept "
            f"count, which a spec does not name; compare {method} as a reference with `match: count`",
            method,
        )
    if "weight_mode" in d:
        _known(d["weight_mode"], WEIGHT_MODES, where, f"{key}.weight_mode", "a weight mode")
    allocator = d.get("allocator", "cluster-interleave" if method == "cluster" else None)
    if allocator is not None:
        a_cls = _resolved(ALLOCATORS, allocator, where, f"{key}.allocator")
        _params_checked(a_cls, d.get("allocation_params") or {}, where, f"{key}.allocation_params")


def _spec(d: Any, where: str, key: str, allowed: set[str]) -> dict[str, Any]:
    _need(isinstance(d, dict), where, key, "a mapping of cell settings", d)
    unknown = sorted(set(d) - allowed)
    _need(not unknown, where, f"{key}.{unknown[0] if unknown else ''}", f"one of {sorted(allowed)}", d)
    _need(isinstance(d.get("method"), str), where, f"{key}.method", "a method name", d.get("method"))
    if "ratio" in d:
        _need(
            _num(d["ratio"]) and 0 < d["ratio"] <= 100,
            where,
            f"{key}.ratio",
            "a percent in (0, 100]",
            d["ratio"],
        )
    if "world_size" in d:
        ws = d["world_size"]
        _need(isinstance(ws, int) and ws >= 1, where, f"{key}.world_size", "a positive integer", ws)
    for k in ("selection_params", "allocation_params"):
        if k in d:
            _need(isinstance(d[k], dict), where, f"{key}.{k}", "a mapping", d[k])
    if "match" in d:
        _need(d["match"] in MATCHES, where, f"{key}.match", f"one of {list(MATCHES)}", d["match"])
        _need(
            d["method"] not in ("full", BASE_METHOD),
            where,
            f"{key}.match",
            "no match for full data or the base model",
            d["match"],
        )
    if key == "reference" and ("match" in d or d["method"] in ("full", BASE_METHOD)):
        extra = sorted(set(d) - PLAIN_REF_KEYS)
        _need(
            not extra,
            where,
            f"{key}.{extra[0] if extra else ''}",
            "only method and match: full data, the base model and a matched run are found by the "
            "cell's setting and seed (and kept count or cost), so other settings would be ignored",
            d,
        )
    _names_known(d, where, key)
    return dict(d)


def _check(c: Any, path: Path, claim: str, i: int) -> Check:
    where = f"{path}: claim {claim}, checks[{i}]"
    _need(isinstance(c, dict), where, "checks", "a mapping", c)
    cid = c.get("id")
    _need(isinstance(cid, str) and bool(cid), where, "id", "a check id (text)", cid)
    where = f"{path}: claim {claim}, check {cid}"
    unknown = sorted(set(c) - CHECK_KEYS)
    _need(not unknown, where, unknown[0] if unknown else "", f"one of {sorted(CHECK_KEYS)}", c)
    for k in ("cell", "metric", "direction"):
        _need(k in c, where, k, "to be given", None)
    cell = _spec(c["cell"], where, "cell", CELL_KEYS)
    ref = c.get("reference")
    ref = None if ref is None else _spec(ref, where, "reference", REF_KEYS)
    metric, direction = c["metric"], c["direction"]
    _need(metric in METRICS, where, "metric", f"one of {list(METRICS)}", metric)
    _need(direction in DIRECTIONS, where, "direction", f"one of {list(DIRECTIONS)}", direction)
    _need(
        (ref is None) == (metric == "purity"),
        where,
        "reference",
        "a reference for every metric but purity",
        ref,
    )
    if direction in ("not_worse", "better"):
        _need(metric == "quality", where, "direction", "below or at_least for a ratio or purity", direction)
        tol = c.get("tolerance")
        _need(
            isinstance(tol, dict),
            where,
            "tolerance",
            "a mapping {points, reason} (and random_share or loss_share)",
            tol,
        )
        unknown_tol = sorted(set(tol) - TOLERANCE_KEYS)
        _need(
            not unknown_tol,
            where,
            f"tolerance.{unknown_tol[0] if unknown_tol else ''}",
            f"one of {sorted(TOLERANCE_KEYS)}",
            tol,
        )
        for k in ("points", "loss_share", "random_share"):
            if k == "points" or k in tol:
                _need(_num(tol.get(k)) and tol[k] >= 0, where, f"tolerance.{k}", "a number >= 0", tol.get(k))
        if "random_share" in tol:
            _need(
                direction == "not_worse" and ref is not None and ref["method"] == "full",
                where,
                "tolerance.random_share",
                "only for a not_worse check against full data (its drop is set against random's "
                "at the same kept count)",
                tol["random_share"],
            )
        _need(
            isinstance(tol.get("reason"), str) and bool(tol["reason"]),
            where,
            "tolerance.reason",
            "why, in words",
            tol.get("reason"),
        )
    else:
        _need(metric != "quality", where, "direction", "not_worse or better for quality", direction)
        thr = c.get("threshold")
        _need(isinstance(thr, dict), where, "threshold", "a mapping {value, reason}", thr)
        _need(_num(thr.get("value")), where, "threshold.value", "a number", thr.get("value"))
        _need(
            isinstance(thr.get("reason"), str) and bool(thr["reason"]),
            where,
            "threshold.reason",
            "why, in words",
            thr.get("reason"),
        )
    ps = c.get("paper_setting")
    if ps is not None:
        _need(
            isinstance(ps, dict) and set(ps) == {"dataset", "model"},
            where,
            "paper_setting",
            "a mapping {dataset, model}",
            ps,
        )
    if metric == "quality":
        for k in ("protocol", "domain"):
            _need(
                isinstance(c.get(k), str),
                where,
                k,
                "text (how / which benchmark average the paper scored)",
                c.get(k),
            )
    if c.get("protocol") is not None:
        _known(c["protocol"], PROTOCOLS, where, "protocol", "a protocol")
    if c.get("domain") is not None:
        _known(c["domain"], (*DOMAINS, ANY_DOMAIN), where, "domain", "a domain")
        _need(
            not (metric == "quality" and c["domain"] == ANY_DOMAIN),
            where,
            "domain",
            "code or medical for quality (which benchmark average)",
            c["domain"],
        )
    return Check(
        claim=claim,
        id=cid,
        cell=cell,
        reference=ref,
        metric=metric,
        direction=direction,
        tolerance=c.get("tolerance"),
        threshold=c.get("threshold"),
        paper_setting=ps,
        protocol=c.get("protocol"),
        domain=c.get("domain"),
        paper_value=str(c.get("paper_value", "")),
        note=str(c.get("note", "")),
    )


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """The claims, checked: a malformed entry is a ClaimsFileError naming the file, the claim
    (and check) id, the key and what was expected."""
    path = Path(path)
    try:
        return list(_load_cached(str(path), path.stat().st_mtime_ns))
    except OSError as e:
        raise ClaimsFileError(f"{path}: cannot read the claims file ({e})") from None


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, _mtime_ns: int) -> tuple[Claim, ...]:
    """The parsed file, once per version of it (every report reads the shipped one)."""
    path = Path(name)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where built: 10x faster
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError) as e:
        raise ClaimsFileError(f"{path}: cannot read the claims file ({e})") from None
    _need(isinstance(data, dict), str(path), "(top level)", "a mapping with 'claims'", type(data).__name__)
    unknown = sorted(set(data) - TOP_KEYS)
    _need(
        not unknown,
        str(path),
        unknown[0] if unknown else "",
        f"one of {sorted(TOP_KEYS)}",
        data.get(unknown[0]) if unknown else None,
    )
    entries = data.get("claims")
    _need(isinstance(entries, list) and bool(entries), str(path), "claims", "a non-empty list", entries)
    out: list[Claim] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        where = f"{path}: claims[{i}]"
        _need(isinstance(e, dict), where, "claims", "a mapping", e)
        cid = e.get("id")
        _need(isinstance(cid, str) and bool(cid), where, "id", "a claim id (text)", cid)
        _need(cid not in seen, where, "id", "a unique claim id", cid)
        seen.add(cid)
        where = f"{path}: claim {cid}"
        unknown = sorted(set(e) - CLAIM_KEYS)
        _need(not unknown, where, unknown[0] if unknown else "", f"one of {sorted(CLAIM_KEYS)}", e)
        for k in ("title", "words", "paper"):
            _need(isinstance(e.get(k), str) and bool(e[k]), where, k, "text", e.get(k))
        checks = e.get("checks")
        _need(isinstance(checks, list) and bool(checks), where, "checks", "a non-empty list", checks)
        parsed = [_check(c, path, cid, j) for j, c in enumerate(checks)]
        ids = [c.id for c in parsed]
        dup = sorted({x for x in ids if ids.count(x) > 1})
        _need(not dup, where, "checks", "unique check ids", dup)
        out.append(Claim(cid, e["title"], e["words"], e["paper"], tuple(parsed)))
    return tuple(out)
