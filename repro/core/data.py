"""Loading instruction data into Pools, and tokenizing Examples for training.

`load_pool(cfg, tokenizer)` reads every `cfg.data.sources[i]` (a local .json/.jsonl file under the
data directory, a hub dataset "hf:<id>", or a registered data source such as the generated demo
pool: repro/core/sources.py), renders rows with their prompt format (`repro.core.prompts`, or a
registered source's own), and returns (train_pool, heldout_pool). Conversations
(sharegpt, messages) are rendered with the tokenizer's chat template when it has one, else with
the suite's plain template; each source's report says which (`template`). Bad rows either stop
the load with a message naming the file, line/row and field (`data.on_bad_row: error`, the
default) or are skipped and counted by reason in `train_pool.skipped` with one summary line on
stderr (`skip`): never silently dropped. `load_pool_report` also returns per-source counts (rows
read, test ids excluded, skipped, train/held-out sizes), since `Pool` has no field for exclusions.

Example ids are stable across runs: "{source name}-{row's own id}" when the row has one ("id",
"task_id", or the key of an id -> object file), else "{source name}-{row index:06d}". The source
name is the file stem (hub: the last part of the id; a registered source: its name), with ".{i}"
added if an earlier source already uses it. An id that already starts with "{name}-" (the demo's
"demo-train-00000") is kept. A registered source that gives its own held-out rows keeps them
(data.heldout_fraction does not split it); every other source's held-out rows are a seeded share.

With `data.chat_template: true`, an Example's prompt is the row's user turn (instruction and input)
through the model tokenizer's chat template, with the assistant's turn opened (`chat_prompt`);
the response follows and ends with the tokenizer's eos token, as with the datasets' own templates.

`tokenize_example`, `TokenizedPool` and `collate` (repro/core/tokens.py) turn Examples into
training tensors.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.config.schema import DataSource, ExperimentConfig
from repro.core.log import get_logger
from repro.core.prompts import (
    FORMATS,
    ChatTemplate,
    DataError,
    PromptFormat,
    RowError,
    detect_format,
    render,
)
from repro.core.sources import HUB_PREFIX, WHAT_A_PATH_IS, is_plugin, plugin_of, source_name
from repro.core.types import Example, Pool

logger = get_logger("data")

__all__ = ["SourceReport", "load_pool", "load_pool_report", "chat_prompt"]

_ID_FIELDS = ("id", "task_id")
_SKIP_HINT = "; set data.on_bad_row=skip to skip and count bad rows instead"


@dataclass
class SourceReport:
    """What loading one source did. `rows` counts rows read, bad and excluded ones included (a
    `limit` stops reading early; a source's own held-out rows are included)."""

    index: int
    path: str
    name: str
    format: str
    rows: int = 0
    excluded: int = 0  # rows whose id is in exclude_ids_file (e.g. the PubMedQA test set)
    skipped: dict[str, int] = field(default_factory=dict)
    n_train: int = 0
    n_heldout: int = 0
    # How conversations were rendered: "chat template of the tokenizer" or "plain (...)"; None
    # for the other formats, which have templates of their own.
    template: str | None = None


@dataclass
class _Raw:
    """One row as read: `where` locates it for messages ("line 3", "row 12", "key '123'")."""

    where: str
    index: int  # 0-based position among the file's rows (blank jsonl lines not counted)
    row: Any = None
    key: str | None = None  # the id when the file maps id -> object
    error: RowError | None = None


# ----------------------------------------------------------------------------- reading


def _read_jsonl(path: Path) -> Iterator[_Raw]:
    # Bytes, line by line: one bad line (bad UTF-8, bad JSON) is one bad row, not a dead file.
    index = 0
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        line = line.rstrip(b"\r")
        if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]  # UTF-8 byte-order mark
        if not line.strip():
            continue
        raw = _Raw(f"line {lineno}", index)
        index += 1
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raw.error = RowError(
                "invalid_utf8", None, f"not valid UTF-8 ({e.reason} at byte {e.start}); expected UTF-8 text"
            )
            yield raw
            continue
        try:
            raw.row = json.loads(text)
        except json.JSONDecodeError as e:
            raw.error = RowError(
                "invalid_json",
                None,
                f"not valid JSON ({e.msg} at column {e.colno}); expected one JSON object per line",
            )
        yield raw


def _read_json(path: Path) -> Iterator[_Raw]:
    # surrogateescape keeps bad bytes as lone surrogates, so they surface per row and field
    # (prompts.text_field reports them) instead of failing the whole file.
    text = path.read_bytes().decode("utf-8", errors="surrogateescape").lstrip("\ufeff")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg} (a .json "
            "file must parse as a whole; a .jsonl file can skip bad lines)"
        ) from None
    if isinstance(data, list):
        for i, row in enumerate(data):
            yield _Raw(f"row {i} (0-based)", i, row)
    elif isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
        for i, (k, row) in enumerate(data.items()):
            yield _Raw(f"row {i} (key {k!r})", i, row, key=str(k))
    else:
        raise DataError(
            f"{path}: expected a JSON list of objects, or an object mapping id -> object; "
            f"got a {type(data).__name__}"
        )


def _read_hub(i: int, src: DataSource) -> Iterator[_Raw]:
    from repro.core.hub import checked_hub_commit

    hub_id = src.path[3:]
    # A hub that cannot be reached, or a revision or id it does not have: one clear error naming
    # HF_ENDPOINT (datasets reports a missing revision as a missing dataset).
    checked_hub_commit(
        "dataset", hub_id, src.revision, f"data.sources[{i}].path", f"data.sources[{i}].revision"
    )
    try:
        import datasets

        pinned = {"revision": src.revision} if src.revision is not None else {}
        ds = datasets.load_dataset(hub_id, split=src.split, **pinned)
    except Exception as e:  # offline, unknown id, bad split, auth...: all need the same advice
        from huggingface_hub import constants

        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise DataError(
            f"data.sources[{i}]: could not load the hub dataset {hub_id!r} (split {src.split!r}) from "
            f"HF_ENDPOINT={constants.ENDPOINT}: {type(e).__name__}: {first}. If the hub is unreachable "
            f"or the id is wrong, download the data file (.json or .jsonl) into your data directory and "
            f"set data.sources[{i}].path to its path relative to data_dir (or CLUSTER_REPRO_DATA)"
        ) from None
    for k, row in enumerate(ds):
        yield _Raw(f"row {k} (0-based)", k, dict(row))


def not_a_file(p: Path) -> str:
    """What `p` is when it is not a regular file a loader can read, as a phrase: 'not found', 'a
    folder, not a file', 'a FIFO (named pipe) ...', 'a symlink to /dev/zero ...'."""
    import os
    import stat

    p = Path(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            return f"a broken symlink (to {os.readlink(p)!r}, which does not exist)"
        return "not found"
    except PermissionError:
        return "not readable (permission denied on it or a folder above it; check its permissions)"
    except OSError as e:
        return f"not readable ({e.strerror})"
    link = f"a symlink to {os.path.realpath(p)!r}, which is " if p.is_symlink() else ""
    if stat.S_ISDIR(st.st_mode):
        return f"{link}a folder, not a file (give the data file inside it)"
    if stat.S_ISFIFO(st.st_mode):
        return f"{link}a FIFO (named pipe), not a regular file: a pool is read more than once"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return f"{link}a device, not a regular file"
    if stat.S_ISSOCK(st.st_mode):
        return f"{link}a socket, not a regular file"
    return ""


def _resolve(cfg: ExperimentConfig, i: int, rel: str, key: str) -> Path:
    """A source file's path: absolute, or relative to the data directory; DataError if missing."""
    p = Path(rel).expanduser()
    where = "the data directory"
    if not p.is_absolute():
        d = cfg.resolved_data_dir()
        origin = "data_dir" if cfg.data_dir else "CLUSTER_REPRO_DATA"
        if d is None:
            raise DataError(
                f"data.sources[{i}].{key} = {rel!r} is relative, but no data directory is "
                "set: set the config key data_dir or the environment variable "
                "CLUSTER_REPRO_DATA to the folder that holds it"
            )
        if not d.is_dir():
            raise DataError(
                f"data.sources[{i}].{key} = {rel!r}: the data directory {str(d)!r} (from "
                f"{origin}) does not exist; fix data_dir or CLUSTER_REPRO_DATA"
            )
        where = f"data directory {str(d)!r} from {origin}"
        p = d / p
    if not p.is_file() or not_a_file(p):
        what = not_a_file(p) or "not a regular file"
        hint = (
            f" (relative paths are resolved against {where}; set data_dir or CLUSTER_REPRO_DATA)"
            if what == "not found"
            else ""
        )
        raise DataError(
            f"data.sources[{i}].{key}: {str(p)!r} is {what}{hint}".replace("is not found", "not found")
        )
    return p


def _exclude_ids(cfg: ExperimentConfig, i: int, src: DataSource) -> set[str]:
    if not src.exclude_ids_file:
        return set()
    p = _resolve(cfg, i, src.exclude_ids_file, "exclude_ids_file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"data.sources[{i}].exclude_ids_file {str(p)!r}: not valid JSON: {e}") from None
    if isinstance(data, dict):
        return {str(k) for k in data}
    if isinstance(data, list) and all(isinstance(x, (str, int)) for x in data):
        return {str(x) for x in data}
    raise DataError(
        f"data.sources[{i}].exclude_ids_file {str(p)!r}: expected a JSON object whose "
        "keys are the ids (or a list of ids)"
    )


# ----------------------------------------------------------------------------- rows -> Examples


def _row_id(raw: _Raw) -> str | None:
    """The row's own id (mapping key, "id" or "task_id"), or None; RowError if present but bad."""
    if raw.key is not None:
        return raw.key
    for k in _ID_FIELDS:
        if k in raw.row:
            v = raw.row[k]
            if v is None or (isinstance(v, str) and not v.strip()):
                raise RowError(f"missing_field:{k}", k, f"field {k!r}: expected a non-empty id, got {v!r}")
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise RowError(
                    f"not_string:{k}",
                    k,
                    f"field {k!r}: expected a string or integer id, got {type(v).__name__}",
                )
            return str(v)
    return None


class _SourceLoader:
    """Turns one source's raw rows into Examples, applying exclusions, bad-row policy and limit."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        seen: dict[str, str],
        report: SourceReport,
        file: str,
        fmt: PromptFormat,
        exclude: set[str],
        chat: ChatTemplate | None,
        tokenizer: Any = None,
    ):
        self.cfg, self.seen, self.report = cfg, seen, report
        self.file, self.fmt, self.exclude, self.chat = file, fmt, exclude, chat
        # not None (data.chat_template): single-turn prompts go through its chat template
        self.tokenizer = None if fmt.conversation else tokenizer

    def bad(self, raw: _Raw, err: RowError) -> None:
        if self.cfg.data.on_bad_row == "error":
            raise DataError(f"{self.file}: {raw.where}: {err}{_SKIP_HINT}") from None
        sk = self.report.skipped
        sk[err.reason] = sk.get(err.reason, 0) + 1

    def examples(self, raws: Iterator[_Raw], limit: int | None) -> list[Example]:
        out: list[Example] = []
        name = self.report.name
        for raw in raws:
            if limit is not None and len(out) >= limit:
                break  # "first N valid rows": later rows are not read, nor judged
            self.report.rows += 1
            try:
                if raw.error is not None:
                    raise raw.error
                if not isinstance(raw.row, dict):
                    raise RowError(
                        "not_object", None, f"expected a JSON object, got {type(raw.row).__name__}"
                    )
                rid = _row_id(raw)
                if rid is not None and rid in self.exclude:
                    self.report.excluded += 1
                    continue
                r = render(raw.row, self.fmt, self.chat)
                eid = (
                    f"{name}-{raw.index:06d}"
                    if rid is None
                    else (rid if rid.startswith(f"{name}-") else f"{name}-{rid}")
                )
                if eid in self.seen:
                    raise RowError(
                        "duplicate_id",
                        "id",
                        f"field 'id': expected a unique id, but {eid!r} was already used by {self.seen[eid]}",
                    )
            except RowError as err:
                self.bad(raw, err)
                continue
            self.seen[eid] = f"{self.file}: {raw.where}"
            prompt = r.prompt if self.tokenizer is None else chat_prompt(self.tokenizer, r.user)
            out.append(
                Example(
                    id=eid, prompt=prompt, response=r.response, source=name, category=r.category, meta=r.meta
                )
            )
        return out


def _first_object(raws: list[_Raw]) -> Any:
    return next((r.row for r in raws if r.error is None and isinstance(r.row, dict)), None)


def chat_template_of(tokenizer: Any) -> ChatTemplate | None:
    """The tokenizer's chat template as a conversation's prompt renderer (with the generation
    prompt, so the response follows it), or None when it has none (or no tokenizer is given)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    bos = tokenizer.bos_token
    adds_bos = bool(bos) and tokenizer("x", add_special_tokens=True)["input_ids"][:1] == [
        tokenizer.bos_token_id
    ]

    def prompt(messages: list[dict[str, str]]) -> str:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # A template that writes BOS itself (Llama 3's) would get a second one when the prompt is
        # encoded with the tokenizer's default specials (_encode_prompts): keep one.
        return text[len(bos) :] if adds_bos and text.startswith(bos) else text

    return prompt


def _load_source(
    cfg: ExperimentConfig,
    i: int,
    src: DataSource,
    names: set[str],
    seen: dict[str, str],
    chat: ChatTemplate | None,
    tokenizer: Any,
) -> tuple[list[Example], list[Example], SourceReport]:
    held: list[Example] = []
    held_raws: list[_Raw] = []
    own_heldout = False
    spec: PromptFormat
    if is_plugin(src.path):
        plugin = plugin_of(src, i)
        got = plugin.rows(cfg.seed)
        name, file = source_name(src.path), f"data source {src.path!r}"
        train_raws = [_Raw(f"train row {k}", k, r) for k, r in enumerate(got.train)]
        own_heldout = bool(plugin.own_heldout)
        held_raws = [_Raw(f"held-out row {k}", k, r) for k, r in enumerate(got.heldout)]
        if held_raws and not own_heldout:
            raise DataError(
                f"data.sources[{i}]: {file} gave held-out rows but does not declare own_heldout "
                "(a bug of the data source: data.heldout_fraction splits its rows)"
            )
        spec = plugin.format if src.format == "auto" else FORMATS[src.format]
        if not train_raws:
            raise DataError(f"data.sources[{i}]: {file} gave no rows")
    else:
        if src.path.startswith(HUB_PREFIX):
            name, file = src.path[3:].rstrip("/").split("/")[-1], src.path
            if src.split != "train":
                name = f"{name}-{src.split}"
            train_raws = list(_read_hub(i, src))
        else:  # a .json / .jsonl file (any other path names a registered source)
            p = _resolve(cfg, i, src.path, "path")
            name, file = p.name.rsplit(".", 1)[0], str(p)
            train_raws = list(_read_jsonl(p) if p.suffix == ".jsonl" else _read_json(p))
        fmt = src.format
        if not train_raws:
            raise DataError(f"data.sources[{i}]: {file} has no rows")
        if fmt == "auto":
            first = _first_object(train_raws)
            if first is None:
                r0 = train_raws[0]
                raise DataError(
                    f"{file}: none of its {len(train_raws)} rows is a readable JSON object, "
                    f"so the prompt format cannot be detected ({r0.where}: "
                    f"{r0.error or 'not an object'})"
                )
            fmt = detect_format(first, f"the first row of {file}")
        spec = FORMATS[fmt]
    if name in names:
        name = f"{name}.{i}"  # two sources with the same stem must not collide on ids
    names.add(name)
    report = SourceReport(i, file, name, spec.name)
    if spec.conversation:
        report.template = (
            "chat template of the tokenizer"
            if chat is not None
            else "plain (### User: / ### Assistant:; no chat template)"
        )
        logger.info(f"{file}: {spec.name} conversations rendered with the {report.template}")
    loader = _SourceLoader(cfg, seen, report, file, spec, _exclude_ids(cfg, i, src), chat, tokenizer)
    train = loader.examples(iter(train_raws), src.limit)
    if own_heldout:
        held = loader.examples(iter(held_raws), None)  # the source's own held-out rows
    elif cfg.data.heldout_fraction > 0 and train:
        # Membership by a seeded shuffle (stable for a seed); both parts keep the file order.
        order = list(range(len(train)))
        random.Random(cfg.seed).shuffle(order)
        n_held = math.floor(len(train) * cfg.data.heldout_fraction)
        held_idx = set(order[len(train) - n_held :])
        held = [e for k, e in enumerate(train) if k in held_idx]
        train = [e for k, e in enumerate(train) if k not in held_idx]
    report.n_train, report.n_heldout = len(train), len(held)
    return train, held, report


def load_pool_report(cfg: ExperimentConfig, tokenizer: Any = None) -> tuple[Pool, Pool, list[SourceReport]]:
    """`load_pool`, plus one SourceReport per source (rows read, excluded, skipped, sizes, how
    conversations were rendered)."""
    if cfg.data.chat_template and tokenizer is None:
        raise DataError(
            "data.chat_template is true: loading the pool needs the model's "
            "tokenizer (its chat template renders the prompts)"
        )
    if not cfg.data.sources:
        raise DataError(f"data.sources: no data source given; expected at least one: {WHAT_A_PATH_IS}")
    chat = chat_template_of(tokenizer)
    single_turn = tokenizer if cfg.data.chat_template else None
    train: list[Example] = []
    held: list[Example] = []
    reports: list[SourceReport] = []
    names: set[str] = set()
    seen: dict[str, str] = {}  # id -> where it was first seen, across all sources
    for i, src in enumerate(cfg.data.sources):
        t, h, rep = _load_source(cfg, i, src, names, seen, chat, single_turn)
        train += t
        held += h
        reports.append(rep)
        if rep.excluded:
            logger.info(f"{rep.path}: excluded {rep.excluded} rows listed in {src.exclude_ids_file}")
    skipped: dict[str, int] = {}
    for rep in reports:
        for k, v in rep.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    if skipped:
        detail = "; ".join(
            f"{r.path}: " + ", ".join(f"{k}={v}" for k, v in sorted(r.skipped.items()))
            for r in reports
            if r.skipped
        )
        logger.warning(f"skipped {sum(skipped.values())} bad rows (data.on_bad_row=skip): {detail}")
    if not train:
        raise DataError(
            "no training examples were loaded from data.sources ("
            + ", ".join(
                f"{r.path}: {r.rows} rows read, {r.excluded} excluded, {sum(r.skipped.values())} skipped"
                for r in reports
            )
            + ")"
        )
    return Pool(train, name="train", skipped=skipped), Pool(held, name="heldout"), reports


def load_pool(cfg: ExperimentConfig, tokenizer: Any = None) -> tuple[Pool, Pool]:
    """(train_pool, heldout_pool) from `cfg.data.sources`. Skip counts are on train_pool.skipped
    (rows are skipped before the split, so they belong to neither part); DataError on any problem.
    `tokenizer`: the model's, whose chat template renders conversations (None: the plain one)
    and, with data.chat_template, single-turn prompts too (then it is required)."""
    train, held, _ = load_pool_report(cfg, tokenizer)
    return train, held


def chat_prompt(tokenizer: Any, user: str) -> str:
    """`user` as the one user message of a conversation through the tokenizer's chat template,
    with the assistant's turn opened (add_generation_prompt), as text. The template's own system
    message, if it adds one, stays. A leading BOS is dropped from the text when the tokenizer adds
    one itself on encoding (Llama- and Mistral-style templates start with it), so the encoded prompt
    holds one BOS, not two. DataError when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DataError(
            f"data.chat_template is true, but the tokenizer of {name!r} has no chat "
            "template (base models often have none); set data.chat_template=false "
            "to use the dataset's own prompt template"
        )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def _adds_bos(tokenizer: Any) -> bool:
    """Whether encoding with the default special tokens puts the BOS token first."""
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return (
        bool(ids)
        and tokenizer.bos_token_id is not None
        and ids[0] == tokenizer.bos_token_id
        and ids != tokenizer("x", add_special_tokens=False)["input_ids"]
    )
