"""Bring your own data (docs/byo-data.md): ShareGPT and OpenAI `messages` pools rendered with the
tokenizer's chat template or the plain one, which turn is the response, errors for malformed
conversations, `cluster-repro ls formats`, and the line that explains CluSTER's kept fraction.

Real tokenizers throughout (the tiny model's byte-level one, given a chat template here where a
test needs one); the end-to-end run of a ShareGPT pool is tests/test_byo_docs.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from repro.core.config.load import from_dict
from repro.core.data import chat_template_of, load_pool_report
from repro.core.prompts import FORMATS, DataError, RowError, detect_format, plain_chat_prompt, render
from repro.core.tokens import IGNORE_INDEX, TokenizedPool
from tests.feature_helpers import plant_features

CHAT = [
    {"from": "system", "value": "Be brief."},
    {"from": "human", "value": "Hi"},
    {"from": "gpt", "value": "Hello!"},
    {"from": "human", "value": "2+2?"},
    {"from": "gpt", "value": "4"},
]
MESSAGES = [
    {"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]), "content": t["value"]}
    for t in CHAT
]
# A ChatML-like template (SmolLM2-Instruct's shape), written here so the tiny tokenizer has one.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_tokenizer_dir() -> Path:
    from repro.core.config.schema import ModelConfig
    from repro.core.models import materialize_model

    return materialize_model(ModelConfig(name_or_path="tiny-random-llama"), 42)


def _tokenizer(model_dir: Path, template: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = template
    return tok


def _cfg(tmp_path: Path, sources: list[dict], **data) -> object:
    return from_dict(
        {"data_dir": str(tmp_path), "data": {"sources": sources, "heldout_fraction": 0.0, **data}}
    )


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_both_formats_are_detected_and_the_last_assistant_turn_is_the_response():
    a = render({"conversations": CHAT}, detect_format({"conversations": CHAT}))
    b = render({"messages": MESSAGES}, detect_format({"messages": MESSAGES}))
    assert detect_format({"conversations": CHAT}) == "sharegpt"
    assert detect_format({"messages": MESSAGES}) == "messages"
    assert a == b  # the same conversation in either format renders the same
    assert a.response == "4"
    # Every earlier turn is context, the first answer included; the prompt ends where the
    # response starts (the plain template, as no chat template was given).
    assert a.prompt == (
        "### System:\nBe brief.\n\n### User:\nHi\n\n### Assistant:\nHello!\n\n"
        "### User:\n2+2?\n\n### Assistant:\n"
    )
    assert a.prompt == plain_chat_prompt(MESSAGES[:-1])
    # Turns after the last answer (an unanswered question) are not used.
    tail = render({"conversations": CHAT + [{"from": "human", "value": "Thanks"}]}, "sharegpt")
    assert tail == a
    # ShareGPT's top-level system field, when no turn is a system turn.
    s = render({"system": "Be kind.", "conversations": CHAT[1:3]}, "sharegpt")
    assert s.prompt.startswith("### System:\nBe kind.\n\n### User:\nHi") and s.response == "Hello!"


def test_labels_cover_the_last_answer_only(tiny_tokenizer_dir: Path, tmp_path: Path):
    """A multi-turn pool through TokenizedPool: loss on the last answer and eos, never on the
    earlier answer (context) or the template's markers."""
    _write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CHAT}])
    tok = _tokenizer(tiny_tokenizer_dir, CHATML)
    train, _, (rep,) = load_pool_report(_cfg(tmp_path, [{"path": "chat.jsonl"}]), tok)
    assert rep.format == "sharegpt" and rep.template == "chat template of the tokenizer"
    (ex,) = train.examples
    assert ex.prompt == tok.apply_chat_template(MESSAGES[:-1], tokenize=False, add_generation_prompt=True)
    assert ex.prompt.endswith("<|im_start|>assistant\n") and "Hello!" in ex.prompt
    item = TokenizedPool(train, tok, 256)[ex.id]
    trained = [t for t, lab in zip(item["input_ids"], item["labels"]) if lab != IGNORE_INDEX]
    assert trained == tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(item["input_ids"][: len(item["input_ids"]) - len(trained)]) == ex.prompt

    # The same file without a chat template: the plain one, and the report says so.
    train, _, (rep,) = load_pool_report(
        _cfg(tmp_path, [{"path": "chat.jsonl"}]), _tokenizer(tiny_tokenizer_dir)
    )
    assert rep.template.startswith("plain") and train.examples[0].prompt == plain_chat_prompt(MESSAGES[:-1])


def test_a_template_that_writes_bos_does_not_get_a_second_one(tiny_tokenizer_dir: Path):
    """Llama 3's template writes BOS, and its tokenizer adds BOS when encoding: one BOS stays."""
    from tokenizers import processors

    tok = _tokenizer(tiny_tokenizer_dir, "{{ bos_token }}" + CHATML)
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)]
    )
    assert tok("x")["input_ids"] == [tok.bos_token_id, ord("x")]
    prompt = chat_template_of(tok)(MESSAGES[:2])
    assert not prompt.startswith(tok.bos_token)
    r = render({"messages": MESSAGES[:3]}, "messages", chat_template_of(tok))
    from repro.core.types import Example, Pool

    pool = Pool([Example("e", r.prompt, r.response, "s")])
    ids = TokenizedPool(pool, tok, 256)["e"]["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1


BAD_ROWS = [  # (row, the field the error names, the skip-count reason)
    (
        {"conversations": [{"value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
        "conversations[0].from",
        "missing_field:conversations.from",
    ),
    ({"conversations": []}, "conversations", "missing_field:conversations"),
    (
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "human", "value": "Hey"}]},
        "conversations",
        "no_response:conversations",
    ),
    (
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Yo"}]},
        "conversations[1].from",
        "bad_value:conversations.from",
    ),
    (
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": ""}]},
        "conversations[1].value",
        "missing_field:conversations.value",
    ),
    (
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": 4}]},
        "conversations[1].value",
        "not_string:conversations.value",
    ),
    ({"conversations": "Hi"}, "conversations", "not_list:conversations"),
    (
        {"conversations": [{"from": ["gpt"], "value": "Hi"}]},
        "conversations[0].from",
        "bad_value:conversations.from",
    ),
]


def test_malformed_conversations_name_the_file_row_and_field(tmp_path: Path):
    good = {"conversations": CHAT}
    for k, (row, fld, reason) in enumerate(BAD_ROWS):
        _write_jsonl(tmp_path / "d.jsonl", [good, row])
        with pytest.raises(DataError) as ei:
            load_pool_report(_cfg(tmp_path, [{"path": "d.jsonl"}]))
        msg = str(ei.value)
        assert f"{tmp_path / 'd.jsonl'}: line 2: field '{fld}'" in msg, (k, msg)
        with pytest.raises(RowError) as re_:
            render(row, "sharegpt")
        assert (re_.value.reason, re_.value.field) == (reason, fld)
    # Skipped instead: counted by reason (no turn index in the key, so counts add up).
    _write_jsonl(tmp_path / "d.jsonl", [good] + [r for r, _, _ in BAD_ROWS] + [BAD_ROWS[0][0]])
    train, _, (rep,) = load_pool_report(_cfg(tmp_path, [{"path": "d.jsonl"}], on_bad_row="skip"))
    assert len(train) == 1 and rep.skipped["missing_field:conversations.from"] == 2
    assert sum(rep.skipped.values()) == len(BAD_ROWS) + 1
    # OpenAI messages name their own fields.
    with pytest.raises(
        RowError,
        match=r"'messages\[0\]\.role': expected one of system, user, "
        r"assistant, got 'tool'",
    ):
        render({"messages": [{"role": "tool", "content": "x"}]}, "messages")


def test_a_template_that_refuses_a_conversation_is_a_row_error(tiny_tokenizer_dir: Path):
    strict = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}" + CHATML
    )
    with pytest.raises(RowError, match="chat template refused.*System role not supported") as ei:
        render({"messages": MESSAGES}, "messages", chat_template_of(_tokenizer(tiny_tokenizer_dir, strict)))
    assert ei.value.reason == "chat_template"


def test_ls_formats_prints_the_registry(capsys):
    from repro.cli import main

    assert main(["ls", "formats"]) == 0
    out = capsys.readouterr().out
    for f in FORMATS.values():
        assert f.describe() in out and f.about in out
    assert "sharegpt: conversations (optional: system, category)" in out


def test_the_kept_fraction_is_explained_at_selection(tmp_path: Path, capsys):
    """Four well-separated clusters of 5, 30, 30 and 25 rows (features already on disk, as the
    pipeline's feature pass leaves them): at r = 0.5 CluSTER keeps 4 x floor(5 x 0.5) = 8 of 90,
    and the line says so, and how to keep more."""
    from method.clustering import explain_kept
    from method.selector import ClusterSelector
    from repro.core.interfaces import SelectionContext
    from repro.core.types import Example, Pool

    sizes = [5, 30, 30, 25]
    rng = np.random.default_rng(0)
    centers = np.eye(4, 16) * 10
    X = np.concatenate([c + 0.1 * rng.standard_normal((n, 16)) for c, n in zip(centers, sizes)])
    pool = Pool([Example(f"e{i}", "p", "r", "s") for i in range(len(X))])
    plant_features(tmp_path, X.astype(np.float32), pool)
    cfg = from_dict({}, ["world_size=4", "train.per_device_batch_size=1", "train.global_batch_size=4"])
    sel = ClusterSelector(ratio=50).select(pool, None, SelectionContext(cfg, 0, 4, tmp_path))
    err = capsys.readouterr().err
    line = (
        "cluster: kept 8/90 (8.9%) = K x m_adj = 4 x 2, m_adj = smallest cluster (5) x r (0.5) "
        "rounded down = 2 (cluster sizes after the soft cap: "
    )
    assert line in err and "raise r (selection.params.ratio) or use a larger pool" in err
    assert len(sel.ids) == 8 and sel.info["kept_explained"] in err
    # Rounding to the per-device batch is named; a fraction near r needs no advice.
    assert explain_kept([7, 30, 30, 23], 50, 2, 2) == (
        "cluster: kept 8/90 (8.9%) = K x m_adj = 4 x 2, m_adj = smallest cluster (7) x r (0.5) "
        "rounded down = 3, then down to a multiple of the per-device batch (2) = 2 (cluster sizes "
        "after the soft cap: 7, 30, 30, 23); the smallest cluster is 7 of 22.5 on average, so this "
        "keeps under half of r: raise r (selection.params.ratio) or use a larger pool"
    )
    assert "raise r" not in explain_kept([20, 22, 24, 24], 100, 20)


def test_the_messages_docs_byo_data_shows_are_the_codes(tmp_path: Path, monkeypatch):
    """docs/byo-data.md's example errors and kept-fraction line, made here from the rows and
    cluster sizes it describes."""
    import re

    from method.clustering import explain_kept
    from tests.conftest import REPO

    page = (REPO / "docs" / "byo-data.md").read_text(encoding="utf-8")
    text = re.findall(r"^```text\n(.*?)^```$", page, re.S | re.M)
    errors = next(b for b in text if "line 7" in b).splitlines()
    bad = {
        7: {"conversations": [{"from": "human", "value": "Hi"}, {"value": "Hello"}]},
        8: {"conversations": []},
        9: {"conversations": [{"from": "human", "value": "Hi"}, {"from": "human", "value": "?"}]},
    }
    monkeypatch.chdir(tmp_path)
    for (line, row), shown in zip(bad.items(), errors, strict=True):
        _write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CHAT}] * (line - 1) + [row])
        with pytest.raises(DataError) as ei:
            load_pool_report(from_dict({"data_dir": ".", "data": {"sources": [{"path": "chat.jsonl"}]}}))
        assert str(ei.value).startswith(shown + ";"), (str(ei.value), shown)
    kept = next(b for b in text if "cluster: kept" in b).strip()
    assert kept == "[cluster-repro] " + explain_kept([5, 30, 30, 25], 50, 2)


def test_a_data_source_of_your_own_plugs_in_through_its_entry_point(tmp_path: Path, monkeypatch, capsys):
    """docs/byo-data.md's own data source class, installed as a package installs it (real metadata
    on sys.path: a .dist-info folder with entry_points.txt, as `pip install` leaves it), reached
    through the registry exactly as the suite's demo pool is: its rows, its params in the hash,
    preflight's did-you-mean, what it declares (seeded, no held-out rows of its own, no domain)
    and `cluster-repro ls sources`."""
    import importlib
    import re
    import sys

    from repro.cli import main
    from repro.core.domains import config_domain
    from repro.core.registry import DATA_SOURCES
    from repro.experiments.sharing import pool_seed_uses
    from repro.preflight import preflight
    from tests.conftest import REPO

    page = (REPO / "docs" / "byo-data.md").read_text(encoding="utf-8")
    code = next(
        b for b in re.findall(r"^```python\n(.*?)^```$", page, re.S | re.M) if "class ArithSource" in b
    )
    pkg = tmp_path / "arith_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "source.py").write_text(code)
    dist = tmp_path / "acme_arith-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-arith\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[cluster_repro.data_sources]\narith = arith_pkg.source:ArithSource\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        assert "arith" in DATA_SOURCES.names() and "acme-arith" in DATA_SOURCES.origin("arith")
        cfg = from_dict(
            {"data": {"sources": [{"path": "arith", "params": {"n": 20}}], "heldout_fraction": 0.25}}
        )
        train, held, (report,) = load_pool_report(cfg)
        assert (len(train), len(held), report.format, report.path) == (15, 5, "alpaca", "data source 'arith'")
        assert all(
            e.id.startswith("arith-") and e.prompt.startswith("Below is an instruction")
            for e in train.examples
        )
        assert load_pool_report(cfg)[0].ids == train.ids  # the same seed: the same rows and split
        default = from_dict({"data": {"sources": [{"path": "arith"}]}})
        assert (
            default.hash()
            == from_dict({"data": {"sources": [{"path": "arith", "params": {"n": 100}}]}}).hash()
        )
        assert default.hash() != cfg.hash()
        problems = [
            str(p)
            for p in preflight(from_dict({"data": {"sources": [{"path": "arith", "params": {"nn": 3}}]}}))
        ]
        assert (
            "data.sources[0].params.nn: data source 'arith' takes no parameter 'nn'; did you mean "
            in "\n".join(problems)
        )
        assert pool_seed_uses(cfg) == [
            "data.sources[0]: the 'arith' source draws its rows from the seed",
            "data.heldout_fraction = 0.25: the held-out split is drawn from the seed",
        ]
        assert config_domain(cfg.to_dict()) is None  # it declares none
        assert main(["ls", "sources"]) == 0
        out = capsys.readouterr().out
        assert "arith  [arith_pkg.source:ArithSource (entry point of acme-arith)]" in out
        assert "n = 100  (an integer >= 1): rows" in out
        assert "format alpaca, domain unknown, seeded true, own held-out rows false" in out
    finally:
        DATA_SOURCES._items.pop("arith", None)
        DATA_SOURCES._from_entry_point.discard("arith")
        for m in ("arith_pkg.source", "arith_pkg"):
            sys.modules.pop(m, None)
