"""Tests for repro.core.data / repro.core.prompts: loading, bad rows, prompt formats, tokenization.

Everything runs offline on small fixture files; the real shared data (CLUSTER_REPRO_DATA, else
../shared/data next to the checkout) is required by the tests that use it: they fail, not skip,
when it is missing, because CI always provides it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.data import load_pool, load_pool_report
from repro.core.prompts import (
    ALPACA_PROMPT_NO_INPUT,
    FORMATS,
    MAGICODER_PROMPT,
    DataError,
    detect_format,
    render,
)
from repro.core.tokens import IGNORE_INDEX, TokenizedPool, collate, tokenize_example
from repro.core.types import Example, Pool

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- helpers


def cfg_for(data_dir, sources, **data):
    return from_dict({"data_dir": str(data_dir) if data_dir else None, "data": {"sources": sources, **data}})


def write_jsonl(path: Path, lines: list) -> Path:
    """Lines are dicts (dumped), str (written as-is) or bytes (written raw)."""
    out = b""
    for ln in lines:
        if isinstance(ln, dict):
            ln = json.dumps(ln)
        out += (ln if isinstance(ln, bytes) else ln.encode()) + b"\n"
    path.write_bytes(out)
    return path


def alp(k: int, **kw) -> dict:
    return {"instruction": f"Do task {k}.", "input": f"in {k}" if k % 2 else "", "output": f"out {k}", **kw}


def shared_data_dir() -> Path:
    env = os.environ.get("CLUSTER_REPRO_DATA")
    d = Path(env) if env else ROOT.parent / "shared" / "data"
    if not (d / "chatdoctor" / "chatdoctor5k.json").is_file():
        pytest.fail(
            f"the shared data is not available at {d} (set CLUSTER_REPRO_DATA to the folder "
            "holding chatdoctor/, codealpaca/, pubmedqa/); CI always provides it"
        )
    return d


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level BPE (256 byte tokens, no merges) with <pad> and </s>: no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<pad>"], vocab["</s>"], vocab["<s>"] = len(vocab), len(vocab) + 1, len(vocab) + 2
    t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="</s>", bos_token="<s>")


# ----------------------------------------------------------------------------- bad rows

BAD = {  # kind -> (line 3 content, skip reason, words the error must contain)
    "invalid_json": ('{"instruction": "x", "output": ', "invalid_json", ["JSON"]),
    "missing": (json.dumps({"instruction": "x"}), "missing_field:output", ["'output'", "non-empty"]),
    "empty": (json.dumps({"instruction": "x", "output": "  "}), "missing_field:output", ["'output'"]),
    "not_string": (
        json.dumps({"instruction": "x", "output": 5}),
        "not_string:output",
        ["'output'", "string"],
    ),
    "non_utf8": (b'{"instruction": "x", "output": "caf\xe9"}', "invalid_utf8", ["UTF-8"]),
    "not_object": ("[1, 2]", "not_object", ["object"]),
    "duplicate_id": (
        json.dumps({"id": "a", "instruction": "x", "output": "y"}),
        "duplicate_id",
        ["'id'", "already used", "line 2"],
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_row_error_names_file_line_field(tmp_path, kind):
    line, _, words = BAD[kind]
    f = write_jsonl(tmp_path / "d.jsonl", [alp(0, id="z"), alp(1, id="a"), line, alp(3)])
    with pytest.raises(DataError) as ei:
        load_pool(cfg_for(tmp_path, [{"path": "d.jsonl"}]))
    msg = str(ei.value)
    assert str(f) in msg and "line 3" in msg and "on_bad_row=skip" in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize(
    "row, words",
    [
        ({"instruction": "x"}, ["'output'"]),
        ({"instruction": "x", "output": ["a"]}, ["'output'", "string"]),
        ({"instruction": "x", "output": "caf\udce9"}, ["'output'", "UTF-8"]),
    ],
)
def test_bad_row_in_json_list_names_row_index(tmp_path, row, words):
    (tmp_path / "d.json").write_text(json.dumps([alp(0), alp(1), row]), encoding="utf-8")
    with pytest.raises(DataError) as ei:
        load_pool(cfg_for(tmp_path, [{"path": "d.json"}]))
    msg = str(ei.value)
    assert str(tmp_path / "d.json") in msg and "row 2" in msg
    for w in words:
        assert w in msg, msg


def test_non_utf8_bytes_in_json_file_are_a_bad_row(tmp_path):
    (tmp_path / "d.json").write_bytes(
        b'[{"instruction": "a", "output": "b"}, {"instruction": "a", "output": "caf\xe9"}]'
    )
    with pytest.raises(DataError, match=r"row 1 .*'output'.*UTF-8"):
        load_pool(cfg_for(tmp_path, [{"path": "d.json"}]))
    train, _ = load_pool(cfg_for(tmp_path, [{"path": "d.json"}], on_bad_row="skip", heldout_fraction=0.0))
    assert len(train) == 1 and train.skipped == {"invalid_utf8": 1}


def test_skip_counts_every_bad_row_by_reason(tmp_path, capsys):
    good = [alp(k) for k in range(10, 15)]
    lines = [alp(0, id="a")] + [BAD[k][0] for k in sorted(BAD)] + good
    write_jsonl(tmp_path / "d.jsonl", lines)
    train, held = load_pool(cfg_for(tmp_path, [{"path": "d.jsonl"}], on_bad_row="skip"))
    expected: dict[str, int] = {}
    for k in BAD:
        expected[BAD[k][1]] = expected.get(BAD[k][1], 0) + 1
    assert train.skipped == expected
    assert len(train) + len(held) == 1 + len(good)
    err = capsys.readouterr().err.strip().splitlines()
    summary = [ln for ln in err if "skipped" in ln]
    assert len(summary) == 1 and "d.jsonl" in summary[0] and "invalid_json=1" in summary[0]


def test_whole_json_file_invalid_is_an_error_even_with_skip(tmp_path):
    (tmp_path / "d.json").write_text('[{"instruction": "a", "output": "b"},', encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.json: not valid JSON at line 1"):
        load_pool(cfg_for(tmp_path, [{"path": "d.json"}], on_bad_row="skip"))


def test_empty_pool_is_an_error(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"instruction": "x"}, {"instruction": "y"}])
    with pytest.raises(DataError, match="no training examples"):
        load_pool(cfg_for(tmp_path, [{"path": "d.jsonl", "format": "alpaca"}], on_bad_row="skip"))


# ----------------------------------------------------------------------------- paths


def test_missing_file_names_source_path_and_env(tmp_path):
    with pytest.raises(DataError) as ei:
        load_pool(cfg_for(tmp_path, [{"path": "demo"}, {"path": "nope/x.json"}]))
    msg = str(ei.value)
    assert "data.sources[1]" in msg and str(tmp_path / "nope" / "x.json") in msg
    assert "CLUSTER_REPRO_DATA" in msg and "data_dir" in msg


def test_missing_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTER_REPRO_DATA", raising=False)
    with pytest.raises(DataError, match=r"sources\[0\].*no data directory.*CLUSTER_REPRO_DATA"):
        load_pool(cfg_for(None, [{"path": "x.json"}]))
    monkeypatch.setenv("CLUSTER_REPRO_DATA", str(tmp_path / "absent"))
    with pytest.raises(DataError) as ei:
        load_pool(cfg_for(None, [{"path": "x.json"}]))
    assert str(tmp_path / "absent") in str(ei.value) and "CLUSTER_REPRO_DATA" in str(ei.value)


def test_env_var_data_dir_and_absolute_paths(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "d.jsonl", [alp(k) for k in range(4)])
    monkeypatch.setenv("CLUSTER_REPRO_DATA", str(tmp_path))
    assert len(load_pool(cfg_for(None, [{"path": "d.jsonl"}], heldout_fraction=0.0))[0]) == 4
    monkeypatch.delenv("CLUSTER_REPRO_DATA")
    assert len(load_pool(cfg_for(None, [{"path": str(tmp_path / "d.jsonl")}]))[0]) == 4


def test_unsupported_path_kind(tmp_path):
    # Neither a file the suite reads nor a hub dataset: looked up as a registered data source.
    with pytest.raises(ConfigError, match=r"data.sources\[0\].path: 'data.csv': expected a \.json / \.jsonl"):
        load_pool(cfg_for(tmp_path, [{"path": "data.csv"}]))


def test_hub_source_unreachable_says_how_to_use_a_local_copy(tmp_path, monkeypatch):
    if not os.environ.get("HF_DATASETS_OFFLINE") and not os.environ.get("HF_HUB_OFFLINE"):
        import datasets

        def offline(*a, **k):  # never touch the network from a test
            raise ConnectionError("Couldn't reach the Hub (offline)")

        monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as ei:
        load_pool(cfg_for(tmp_path, [{"path": "hf:no-such-org/no-such-dataset"}]))
    msg = str(ei.value)
    assert "no-such-org/no-such-dataset" in msg and "data.sources[0].path" in msg and "data_dir" in msg


def test_hub_rows_are_loaded_like_a_file(tmp_path, monkeypatch):
    import datasets

    rows = [{"problem": f"p{k}", "solution": f"s{k}"} for k in range(5)]
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, split: rows)
    train, _ = load_pool(cfg_for(tmp_path, [{"path": "hf:org/Magic-75K"}], heldout_fraction=0.0))
    assert train.ids[0] == "Magic-75K-000000" and train.examples[4].response == "s4"
    assert train.examples[0].prompt == MAGICODER_PROMPT.format(instruction="p0")


# ----------------------------------------------------------------------------- formats


def test_alpaca_renders_with_and_without_input():
    r = render({"instruction": "Add.", "input": "1 2", "output": "3"}, "alpaca")
    assert r.prompt.startswith("Below is an instruction that describes a task, paired with an input")
    assert "### Instruction:\nAdd.\n\n### Input:\n1 2\n\n### Response:" in r.prompt
    assert r.prompt.endswith("### Response:") and r.response == "3"
    r2 = render({"instruction": "Add.", "input": "", "output": " 3\n"}, "alpaca")
    assert r2.prompt == ALPACA_PROMPT_NO_INPUT.format(instruction="Add.")
    assert "### Input:" not in r2.prompt and r2.response == " 3\n"  # response exactly the output
    # new_codealpaca.json rows carry both output and response: output is used.
    r3 = render({"instruction": "i", "input": "", "output": "OUT", "response": "RESP"}, "alpaca")
    assert r3.response == "OUT"


def test_magicoder_renders_both_field_pairs():
    a = render({"problem": "Write f.", "solution": "def f(): pass"}, "magicoder")
    b = render({"instruction": "Write f.", "response": "def f(): pass"}, "magicoder")
    assert a == b
    assert a.prompt.startswith("You are an exceptionally intelligent coding assistant")
    assert a.prompt.endswith("\n\n@@ Instruction\nWrite f.\n\n@@ Response\n")
    assert a.response == "def f(): pass"


def test_pubmedqa_renders_contexts_question_and_decision():
    row = {
        "QUESTION": "Does X cause Y?",
        "CONTEXTS": ["Ctx one.", "Ctx two."],
        "LONG_ANSWER": "It does.",
        "final_decision": "yes",
    }
    r = render(row, "pubmedqa")
    assert "Ctx one.\nCtx two." in r.prompt and "Question: Does X cause Y?" in r.prompt
    assert r.prompt.endswith("### Response:")
    assert r.response == "It does.\nAnswer: yes" and r.meta == {"final_decision": "yes"}
    with pytest.raises(DataError, match="final_decision"):
        render({**row, "final_decision": "perhaps"}, "pubmedqa")


def test_auto_detection():
    assert detect_format({"instruction": "a", "input": "", "output": "b"}) == "alpaca"
    assert detect_format({"instruction": "a", "input": "", "output": "b", "response": "b"}) == "alpaca"
    assert detect_format({"problem": "a", "solution": "b"}) == "magicoder"
    assert detect_format({"instruction": "a", "response": "b"}) == "magicoder"
    assert (
        detect_format({"QUESTION": "q", "CONTEXTS": [], "LONG_ANSWER": "l", "final_decision": "no"})
        == "pubmedqa"
    )
    with pytest.raises(DataError) as ei:
        detect_format({"question": "q", "answer": "a"})
    msg = str(ei.value)
    assert "['answer', 'question']" in msg
    for spec in ("instruction+output", "problem+solution", "instruction+response", "LONG_ANSWER"):
        assert spec in msg
    assert set(FORMATS) == {"alpaca", "magicoder", "pubmedqa", "sharegpt", "messages"}


def test_auto_detection_in_load_names_the_file(tmp_path):
    write_jsonl(tmp_path / "q.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"q\.jsonl.*\['answer', 'question'\]"):
        load_pool(cfg_for(tmp_path, [{"path": "q.jsonl"}]))


def test_demo_source_keeps_category_and_meta(tmp_path):
    demo = {"path": "demo", "params": {"train_size": 24, "heldout_per_category": 1}}
    train, held = load_pool(from_dict({"data": {"sources": [demo]}}))
    assert len(train) == 24 and len(held) == 12
    assert train.ids[0] == "demo-train-00000"  # the generator's ids, not re-prefixed
    assert all(e.category for e in train.examples + held.examples)
    assert all(e.meta.get("answer") is not None for e in held.examples)
    ex = train.examples[0]
    assert ex.prompt.startswith("### Instruction:\n") and ex.prompt.endswith("### Response:\n")
    assert "Below is an instruction" not in ex.prompt  # the compact demo template


# ----------------------------------------------------------------------------- pubmedqa exclusion


def test_pubmedqa_excludes_test_ids(tmp_path, capsys):
    rows = {
        str(100 + k): {
            "QUESTION": f"q{k}?",
            "CONTEXTS": [f"c{k}"],
            "LONG_ANSWER": f"l{k}",
            "final_decision": "maybe",
        }
        for k in range(6)
    }
    (tmp_path / "pq.json").write_text(json.dumps(rows))
    (tmp_path / "test.json").write_text(json.dumps({"101": "yes", "104": "no", "999": "no"}))
    cfg = cfg_for(tmp_path, [{"path": "pq.json", "exclude_ids_file": "test.json"}], heldout_fraction=0.0)
    train, held, (rep,) = load_pool_report(cfg)
    assert train.ids == ["pq-100", "pq-102", "pq-103", "pq-105"] and not held.examples
    assert rep.excluded == 2 and rep.format == "pubmedqa" and train.skipped == {}
    assert "excluded 2 rows" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"exclude_ids_file.*missing\.json"):
        load_pool(cfg_for(tmp_path, [{"path": "pq.json", "exclude_ids_file": "missing.json"}]))


def test_pubmedqa_real_files_exclude_500_test_ids():
    d = shared_data_dir()
    cfg = cfg_for(
        d, [{"path": "pubmedqa/ori_pqal.json", "exclude_ids_file": "pubmedqa/test_ground_truth.json"}]
    )
    train, held, (rep,) = load_pool_report(cfg)
    test_ids = set(json.loads((d / "pubmedqa" / "test_ground_truth.json").read_text()))
    assert rep.rows == 1000 and rep.excluded == 500 and len(train) + len(held) == 500
    assert not {i.removeprefix("ori_pqal-") for i in train.ids + held.ids} & test_ids


# ----------------------------------------------------------------------------- ids and split


def test_ids_stable_and_split_stable_and_disjoint(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [alp(k) for k in range(50)])
    write_jsonl(tmp_path / "e.jsonl", [alp(k, task_id=f"T{k}") for k in range(20)])
    srcs = [{"path": "d.jsonl"}, {"path": "e.jsonl"}]
    t1, h1 = load_pool(cfg_for(tmp_path, srcs, heldout_fraction=0.2))
    t2, h2 = load_pool(cfg_for(tmp_path, srcs, heldout_fraction=0.2))
    assert (t1.ids, h1.ids) == (t2.ids, h2.ids)
    assert len(h1) == 10 + 4 and not set(t1.ids) & set(h1.ids)
    assert set(t1.ids) | set(h1.ids) == {f"d-{k:06d}" for k in range(50)} | {f"e-T{k}" for k in range(20)}
    # Both parts keep the file order (sources in config order, rows in file order).
    for part in (t1, h1):
        keys = [(i[0], int(i[2:]) if i[0] == "d" else int(i[3:])) for i in part.ids]
        assert keys == sorted(keys)
    t3, h3 = from_seed(tmp_path, srcs, 7)
    assert set(h3.ids) != set(h1.ids) and len(h3) == len(h1)


def from_seed(tmp_path, srcs, seed):
    cfg = cfg_for(tmp_path, srcs, heldout_fraction=0.2)
    cfg.seed = seed
    return load_pool(cfg)


def test_same_stem_sources_do_not_collide_and_limit_counts_valid_rows(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_jsonl(tmp_path / "a" / "train.jsonl", [alp(0), "not json", alp(2), alp(3)])
    write_jsonl(tmp_path / "b" / "train.jsonl", [alp(0)])
    cfg = cfg_for(
        tmp_path,
        [{"path": "a/train.jsonl", "limit": 2}, {"path": "b/train.jsonl"}],
        heldout_fraction=0.0,
        on_bad_row="skip",
    )
    train, _ = load_pool(cfg)
    assert train.ids == ["train-000000", "train-000002", "train.1-000000"]
    assert train.skipped == {"invalid_json": 1}


# ----------------------------------------------------------------------------- tokenization


def ex(prompt="### Q:\nhi", response=" héllo wörld", id="x-1"):
    return Example(id=id, prompt=prompt, response=response, source="t")


def test_labels_mask_prompt_and_response_decodes_back(tok):
    e = ex()
    out = tokenize_example(e, tok, max_length=256)
    n_prompt = len(tok(e.prompt, add_special_tokens=False)["input_ids"])
    assert out["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert all(v != IGNORE_INDEX for v in out["labels"][n_prompt:])
    resp_ids = out["input_ids"][n_prompt:]
    assert out["labels"][n_prompt:] == resp_ids and resp_ids[-1] == tok.eos_token_id
    assert tok.decode(resp_ids) == e.response + tok.eos_token
    assert tok.decode(out["input_ids"][:n_prompt]) == e.prompt
    assert out["n_response_tokens"] == len(resp_ids) and len(out["input_ids"]) == len(out["labels"])


def test_truncation_cuts_from_the_right(tok):
    e = ex(prompt="p" * 10, response="r" * 20)
    full = tokenize_example(e, tok, 256)
    assert len(full["input_ids"]) == 31
    cut = tokenize_example(e, tok, 15)
    assert cut["input_ids"] == full["input_ids"][:15] and cut["labels"] == full["labels"][:15]
    assert cut["n_response_tokens"] == 5 and tok.eos_token_id not in cut["input_ids"]
    with pytest.raises(DataError) as ei:
        tokenize_example(e, tok, 10)
    assert "'x-1'" in str(ei.value) and "10 tokens" in str(ei.value) and "max_length=10" in str(ei.value)


def test_prompt_specials_bos_kept_trailing_eos_dropped(tok):
    from tokenizers import processors

    t2 = copy.deepcopy(tok)
    t2._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.bos_token_id), ("</s>", tok.eos_token_id)]
    )
    out = tokenize_example(ex(prompt="ab", response="c"), t2, 64)
    assert out["input_ids"] == [tok.bos_token_id] + tok("ab", add_special_tokens=False)["input_ids"] + tok(
        "c", add_special_tokens=False
    )["input_ids"] + [tok.eos_token_id]
    assert out["labels"][:3] == [IGNORE_INDEX] * 3


def test_tokenized_pool_by_id_and_skip(tok, capsys):
    pool = Pool([ex(id="a", prompt="p" * 5), ex(id="b", prompt="p" * 40), ex(id="c", prompt="q")])
    with pytest.raises(DataError, match="'b'"):
        TokenizedPool(pool, tok, 32)
    tp = TokenizedPool(pool, tok, 32, on_bad_row="skip")
    assert len(tp) == 2 and tp.ids == ["a", "c"] and tp.skipped == {"no_response_tokens": 1}
    assert tp["c"] == tokenize_example(pool.examples[2], tok, 32) and tp[0] == tp["a"]
    assert "b" not in tp and "skipped 1" in capsys.readouterr().err
    with pytest.raises(KeyError, match="'b'"):
        tp["b"]


def test_collate_right_pads(tok):
    a = {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}
    b = {"input_ids": [8], "labels": [8]}
    out = collate([a, b], pad_token_id=tok.pad_token_id)
    pad = tok.pad_token_id
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, pad, pad]]
    assert out["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert {v.dtype for v in out.values()} == {__import__("torch").long}


# ----------------------------------------------------------------------------- real shared files


def test_real_shared_files_load(tok):
    d = shared_data_dir()
    srcs = [
        {"path": "chatdoctor/chatdoctor5k.json"},
        {"path": "codealpaca/code_alpaca_2k.json"},
        {"path": "codealpaca/new_codealpaca.json"},
    ]
    # code_alpaca_2k.json has two rows with an empty output (rows 237 and 1859).
    with pytest.raises(DataError, match=r"code_alpaca_2k\.json: row 237 .*'output'"):
        load_pool(cfg_for(d, srcs))
    train, held, reps = load_pool_report(cfg_for(d, srcs, on_bad_row="skip"))
    assert [(r.name, r.format, r.n_train + r.n_heldout) for r in reps] == [
        ("chatdoctor5k", "alpaca", 5452),
        ("code_alpaca_2k", "alpaca", 2015),
        ("new_codealpaca", "alpaca", 4535),
    ]
    assert train.skipped == {"missing_field:output": 2}
    assert len(held) == sum(r.n_heldout for r in reps) and not set(train.ids) & set(held.ids)
    t2, h2 = load_pool(cfg_for(d, srcs, on_bad_row="skip"))
    assert t2.ids == train.ids and h2.ids == held.ids
    tp = TokenizedPool(Pool(train.examples[:50]), tok, 512, on_bad_row="skip")
    assert len(tp) + tp.skipped.get("no_response_tokens", 0) == 50
