"""configs/experiments/newer-models.yaml (Qwen2.5, Llama-3.1, Mistral-7B-v0.3 on the paper's cells) and
`data.chat_template`: the dry-run plan, the chat prompts, and one cell's pipeline on CPU with the
tiny model standing in for the hub model. (Every shipped grid also goes through the expansion and
preflight tests of test_slurm_grid.py and test_preflight.py.)"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from repro.core.config.load import from_dict
from repro.core.config.schema import LoraConfig, ModelConfig
from repro.core.data import chat_prompt, load_pool
from repro.core.memory import model_shape
from repro.core.prompts import DataError
from repro.core.tokens import tokenize_example
from repro.core.types import Example
from repro.experiments.experiment import load_experiment
from tests.conftest import CONFIGS

GRID = CONFIGS / "experiments" / "newer-models.yaml"
# A ChatML template, the form of Qwen2.5's (whose tokenizer is not available offline); the tiny
# model's byte-level tokenizer carries it here.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_grid_cells_models_and_prompt_templates() -> None:
    cells = {c.id: c for c in load_experiment(GRID).cells}
    # 3 datasets x 4 models x (full + CluSTER at 3 ratios) x 3 seeds at 4 GPUs, and the 8-GPU
    # scaling runs of Magicoder with Qwen2.5-7B.
    assert len(cells) == 3 * 4 * 4 * 3 + 4 * 3
    expect = {
        "qwen25-7b": ("Qwen/Qwen2.5-7B", True),
        "qwen25-14b": ("Qwen/Qwen2.5-14B", True),
        "llama31-8b": ("meta-llama/Llama-3.1-8B", False),
        "mistral-7b-v03": ("mistralai/Mistral-7B-v0.3", False),
    }
    for c in cells.values():
        cfg = c.config()
        name, chat = expect[c.axes["model"]]
        assert (cfg.model.name_or_path, cfg.data.chat_template) == (name, chat)
        assert model_shape(cfg.model.name_or_path) is not None  # the memory plan knows the shape
        assert cfg.train.strategy == "fsdp" and cfg.data.max_length == 1216  # the paper's recipe
    med = cells["medinstruct.llama31-8b.cluster-r50.ws4.s43"].config()
    assert med.eval.benchmarks == ["medqa", "medmcqa", "pubmedqa", "mmlu_medical"]
    assert med.selection.params["ratio"] == 50 and med.allocation.method == "cluster-interleave"
    assert cells["magicoder.qwen25-7b.full.ws8.s42"].config().train.global_batch_size == 512


def test_dry_run_plans_memory_and_gpu_hours(tmp_path: Path, capsys) -> None:
    from repro.cli import main

    rc = main(
        [
            "launch",
            str(GRID),
            "--dry-run",
            "--profile",
            str(CONFIGS / "clusters" / "example.yaml"),
            "--results",
            str(tmp_path),
            "--only",
            "seed=42",
            "--allow-missing-benchmarks",  # no benchmark data here; the plan is tested
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert "52 cells, 0 done, 52 to run" in out
    assert "the 52 cells to run passed every check" in out
    total = float(out.split("GPU-hours (estimate): training ")[1].split()[0].replace(",", ""))
    assert total > 0
    row = next(ln for ln in out.splitlines() if ln.startswith("medinstruct.qwen25-14b.full.ws4.s42"))
    gib = float(row.split()[7])  # the memory plan's GiB per GPU, within the profile's 80
    assert 20 < gib <= 80 and "!" not in row
    assert not any(tmp_path.iterdir()), "a dry run must not write anything"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model with a ChatML chat template in its tokenizer."""
    from transformers import AutoTokenizer

    from repro.core.models import materialize_model

    tmp = tmp_path_factory.mktemp("chat-model")
    src = materialize_model(
        ModelConfig(name_or_path="tiny-random-llama", lora=LoraConfig(enabled=False)), seed=0
    )
    shutil.copytree(src, tmp / "tiny-chat")
    tok = AutoTokenizer.from_pretrained(tmp / "tiny-chat")
    tok.chat_template = CHATML
    tok.save_pretrained(tmp / "tiny-chat")
    return tmp / "tiny-chat"


def test_chat_prompts_wrap_the_user_turn_once(chat_model: Path) -> None:
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    assert chat_prompt(tok, "Add 2 and 3.") == (
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n"
    )
    # A tokenizer that adds BOS by itself, with a template that starts with it (Llama, Mistral):
    # the text drops it, so the encoded prompt holds one BOS.
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tok.bos_token_id)]
    )
    tok.chat_template = "{{ bos_token }}" + CHATML
    text = chat_prompt(tok, "Hi")
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    item = tokenize_example(Example(id="x", prompt=text, response="Hello", source="t"), tok, 256)
    ids = item["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    # No template: an error that names the fix, at load time too.
    tok.chat_template = None
    with pytest.raises(DataError, match="has no chat template.*data.chat_template=false"):
        chat_prompt(tok, "Hi")
    with pytest.raises(DataError, match="needs the model's tokenizer"):
        load_pool(from_dict({}, ["data.chat_template=true"]))


def test_a_qwen_cell_runs_end_to_end_with_the_tiny_model_standing_in(
    chat_model: Path, shared_data: Path, tmp_path: Path
) -> None:
    """magicoder.qwen25-7b.full.ws4.s42 as the grid makes it (the recipe: fsdp over 4 workers,
    Adafactor, activation checkpointing, the chat template), with the tiny chat model for
    Qwen2.5-7B, 64 CodeAlpaca rows in Magicoder's format for the hub's Magicoder-OSS-Instruct, one
    optimizer step and no benchmarks."""
    import yaml

    from repro.pipeline import run_experiment

    # The grid with Qwen2.5-7B on Magicoder alone: with the tiny model and CodeAlpaca standing in
    # for every model and dataset, the other cells would be this cell's config again (the grid
    # refuses one config twice).
    data = yaml.safe_load(GRID.read_text())
    data["base"] = str((GRID.parent / data["base"]).resolve())
    axes = data["grid"]
    axes["models"] = {"qwen25-7b": axes["models"]["qwen25-7b"]}
    axes["datasets"] = {"magicoder": axes["datasets"]["magicoder"]}  # (the data is overridden too)
    one = tmp_path / "newer-models-qwen7b.yaml"
    one.write_text(yaml.safe_dump(data))
    grid = load_experiment(
        one,
        [
            f"output_dir={tmp_path}",
            f"model.name_or_path={chat_model}",
            "model.revision=null",  # a local directory stands in for the hub model: nothing to pin
            f"data_dir={shared_data}",
            "data.sources=[{path: codealpaca/code_alpaca_2k.json, format: magicoder, limit: 64}]",
            "data.max_length=512",
            "data.on_bad_row=skip",
            "train.global_batch_size=8",
            "train.max_steps=1",
            "eval.benchmarks=[]",
        ],
    )
    cell = next(c for c in grid.cells if c.id == "magicoder.qwen25-7b.full.ws4.s42")
    cfg = cell.config()
    assert cfg.data.chat_template and cfg.world_size == 4 and cfg.train.strategy == "fsdp"
    run_dir = run_experiment(cfg)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    raw = json.loads((shared_data / "codealpaca" / "code_alpaca_2k.json").read_text())
    pool = [json.loads(line) for line in (run_dir / "pool.jsonl").read_text().splitlines()]
    assert len(pool) > 8
    for ex in pool:  # the user turn (instruction, then input) in the template, nothing else
        row = raw[int(ex["id"].rsplit("-", 1)[1])]
        user = row["instruction"] + (f"\n\n{row['input']}" if row["input"].strip() else "")
        assert ex["prompt"] == chat_prompt(tok, user) and ex["response"] == row["output"]
    train = json.loads((run_dir / "train.json").read_text())
    assert (train["status"], train["steps_run"], train["strategy"]) == ("ok", 1, "fsdp")
    with open(run_dir / "results.part.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and {r["status"] for r in rows} == {"ok"}


def test_hub_downloads_skip_mistral_format_weights(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hub cannot be reached here: snapshot_download is replaced by a recorder that returns a
    folder with transformers shards, and the test checks what models.py asks for."""
    import huggingface_hub

    from repro.core import models

    calls = []
    (tmp_path / "model-00001-of-00003.safetensors").write_bytes(b"")

    def fake(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert models._from_hub("mistralai/Mistral-7B-v0.3") == tmp_path
    ((repo, kw),) = calls
    assert repo == "mistralai/Mistral-7B-v0.3" and "*.safetensors" in kw["allow_patterns"]
    assert kw["ignore_patterns"] == ["consolidated*.safetensors"]
    assert "*.jinja" in kw["allow_patterns"]  # chat templates saved as chat_template.jinja
