"""The memory plan (repro/core/memory.py) and its checks before a launch.

The calibration points (the 7B ddp peak measured on an H200, CPU RSS of real training steps)
are in docs/memory.md; these tests hold the plan to the GPU one and to what it must decide.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.config.load import from_dict, load_config
from repro.core.memory import GIB, SHAPES, model_shape, plan_for_config, plan_memory
from repro.preflight import preflight
from repro.problems import CheckContext
from slurm.profile import ClusterProfile, GpuSpec
from tests.conftest import CONFIGS

RECIPE = CONFIGS / "paper" / "recipe.yaml"


def test_parameter_counts_match_the_published_models() -> None:
    assert SHAPES["llama-2-7b"].params() == 6_738_415_616
    assert SHAPES["llama-2-13b"].params() == 13_015_864_320
    assert SHAPES["smollm2-135m"].params() == 134_515_008  # tied embeddings counted once


def test_plan_is_within_10_percent_of_the_measured_7b_ddp_peak() -> None:
    """One worker of the recipe under ddp (Adafactor, 1,216 tokens, no checkpointing) peaked at
    78,265 MiB allocated on an H200 (issue 13)."""
    plan = plan_memory(
        SHAPES["codellama-7b-python"],
        strategy="ddp",
        world_size=1,
        seq_len=1216,
        batch=1,
        optimizer="adafactor",
    )
    measured = 78_265 * 2**20
    assert plan.peak == pytest.approx(measured, rel=0.10)
    # ... and that does not leave room on an 80 GB GPU for the context and the allocator's slack.
    assert plan.required_gib() > 80


def test_13b_fits_80gb_at_world_size_4_under_fsdp_with_checkpointing_and_not_under_ddp() -> None:
    kw = dict(world_size=4, seq_len=1216, batch=1, optimizer="adafactor")
    ddp = plan_memory(SHAPES["llama-2-13b"], strategy="ddp", **kw)
    fsdp = plan_memory(SHAPES["llama-2-13b"], strategy="fsdp", activation_checkpointing=True, **kw)
    assert ddp.required_gib() > 80 >= fsdp.required_gib()
    # fsdp keeps 1/4 of the weights, gradients and optimizer state; ddp also keeps its buckets.
    assert fsdp.weights == pytest.approx(ddp.weights / 4)
    assert fsdp.gradients == pytest.approx(ddp.gradients / 4)
    assert ddp.ddp_buckets == ddp.gradients and fsdp.ddp_buckets == 0


def test_checkpointing_shrinks_activations_and_lora_shrinks_the_state() -> None:
    s = SHAPES["llama-2-7b"]
    kw = dict(strategy="ddp", world_size=4, seq_len=1216, batch=4, optimizer="adamw")
    plain, ckpt = plan_memory(s, **kw), plan_memory(s, activation_checkpointing=True, **kw)
    assert ckpt.activations < plain.activations / 5
    lora = plan_memory(s, lora_r=8, lora_targets=["q_proj", "v_proj"], **kw)
    assert lora.gradients < plain.gradients / 100 and lora.optimizer < plain.optimizer / 100
    assert lora.weights == plain.weights  # the frozen base is still held in fp32


def test_shapes_come_from_hub_ids_builtins_and_local_config_json(tmp_path: Path) -> None:
    assert model_shape("codellama/CodeLlama-13b-Python-hf") == SHAPES["codellama-13b-python"]
    assert model_shape("tiny-random-llama", 32, 3).layers == 3
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 128, "intermediate_size": 256, '
        '"num_hidden_layers": 3, "num_attention_heads": 4, '
        '"vocab_size": 1000, "tie_word_embeddings": true}'
    )
    assert model_shape(str(tmp_path)).params() == 3 * (4 * 128 * 128 + 3 * 128 * 256 + 256) + 1000 * 128 + 128
    assert model_shape("some-org/unknown-model") is None


def _profile(memory_gb: float | None) -> ClusterProfile:
    return ClusterProfile(gpu=GpuSpec(memory_gb=memory_gb))


def _memory_problems(cfg, profile) -> list:
    return [p for p in preflight(cfg, CheckContext(profile=profile)) if p.kind == "memory"]


def test_launch_preflight_refuses_a_cell_over_the_gpu_memory_and_names_the_fix() -> None:
    over = load_config(
        RECIPE,
        [
            "model.name_or_path=meta-llama/Llama-2-13b-hf",
            "train.strategy=ddp",
            "train.activation_checkpointing=false",
        ],
    )
    (problem,) = _memory_problems(over, _profile(80))
    assert problem.blocking and problem.key == "train.strategy"
    assert "more than gpu.memory_gb = 80" in problem.message
    assert "fits with train.strategy=fsdp" in problem.message
    # The recipe as shipped (fsdp + checkpointing) fits; without a stated memory nothing is checked.
    assert (
        _memory_problems(load_config(RECIPE, ["model.name_or_path=meta-llama/Llama-2-13b-hf"]), _profile(80))
        == []
    )
    assert _memory_problems(over, _profile(None)) == []
    # Host memory: every worker loads the whole fp32 13B model (52 GB) before sharding it.
    host = ClusterProfile(mem_per_gpu_gb=48)
    (h,) = _memory_problems(load_config(RECIPE, ["model.name_or_path=meta-llama/Llama-2-13b-hf"]), host)
    assert "more than the profile's mem_per_gpu_gb = 48" in h.message
    # A GPU too small for any strategy at this world size: more GPUs is the advice.
    (small,) = _memory_problems(over, _profile(24))
    assert "world_size=8" in small.message or "world_size=16" in small.message


def test_launch_force_submits_a_cell_over_memory_but_not_other_problems(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"gpu": {"memory_gb": 80}, "output_dir": str(tmp_path / "runs")}))
    cmd = [
        sys.executable,
        "-m",
        "repro",
        "launch",
        str(CONFIGS / "experiments" / "paper.yaml"),
        "--profile",
        str(prof),
        "--dry-run",
        "--only",
        "seed=42",
        "--only",
        "model=codellama-python-13b",
        "--only",
        "method=full",
        "--allow-missing-benchmarks",  # no benchmark data here; the memory check is tested
        "train.strategy=ddp",
    ]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2, plain.stdout[-2000:] + plain.stderr[-2000:]
    assert "more than gpu.memory_gb = 80" in plain.stdout
    assert "!" in next(ln for ln in plain.stdout.splitlines() if ln.startswith("magicoder."))
    forced = subprocess.run(cmd + ["--force"], capture_output=True, text=True, timeout=120)
    assert forced.returncode == 0, forced.stdout[-2000:] + forced.stderr[-2000:]
    # Still reported, as a note rather than an error.
    assert any(
        ln.strip().startswith("note") and "more than gpu.memory_gb = 80" in ln
        for ln in forced.stdout.splitlines()
    )


def test_validate_prints_the_memory_plan() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "repro", "validate", str(RECIPE)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("memory plan"))
    cfg = load_config(RECIPE)
    assert f"GPU {plan_for_config(cfg).required_gib():.1f} GiB" in line
    assert "fsdp, world size 4, activation checkpointing" in line


def test_plan_for_a_cpu_run_adds_the_process_and_the_load() -> None:
    cfg = from_dict({}, ["model.name_or_path=tiny-random-llama", "world_size=2", "train.strategy=fsdp"])
    plan = plan_for_config(cfg, device="cpu")
    assert plan is not None and plan.device == "cpu" and plan.process_overhead > 100 * 2**20
    assert plan.required_gib() == pytest.approx((plan.peak + plan.process_overhead) / GIB)
    assert plan.peak >= plan.load


def test_bench_paper_step_runs_the_recipe_step_on_a_cut_shape_and_reports_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one-GPU check runs on CPU too: a 1-layer SmolLM2-width model, fsdp + checkpointing at
    world size 2, 2 accumulation steps; JSON with step time, memory beside the plan, features."""
    import json
    import subprocess
    import sys

    out = tmp_path / "step.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "bench",
            "paper-step",
            "--shape",
            "smollm2-135m",
            "--layers",
            "1",
            "--strategy",
            "fsdp",
            "--activation-checkpointing",
            "--world-size",
            "2",
            "--steps",
            "2",
            "--grad-accum",
            "2",
            "--seq-len",
            "32",
            "--feature-examples",
            "4",
            "--feature-batch",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res == json.loads(p.stdout[p.stdout.index("{") :])
    assert res["params"] == SHAPES["smollm2-135m"].params() - 29 * SHAPES["smollm2-135m"].layer_params()
    assert res["tokens_per_s"] == pytest.approx(2 * 2 * 32 / res["step_s"])
    assert res["mfu"] is None and res["device"] == "cpu"  # no bf16 peak to divide by on a CPU
    assert res["peak_memory_mib"] > 0 and 0.5 < res["plan_over_measured"] < 2.0
    assert res["features"]["examples"] == 4 and res["features"]["examples_per_s"] > 0
    assert res["selection_share_of_2_epoch_training"] > 0
    # Flags the bench refuses, through the CLI's own entry point in this process (the run above is
    # the real process): exit status 2 and the flag named, no traceback.
    from repro.cli import main

    for flags, message in (
        (["--shape", "llama-3"], "invalid choice: 'llama-3'"),
        (
            ["--shape", "llama-2-7b", "--world-size", "0"],
            "argument --world-size: expected an integer >= 1, got '0'",
        ),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as bad:
            main(["bench", "paper-step", *flags])
        err = capsys.readouterr().err
        assert bad.value.code == 2 and message in err and "Traceback" not in err, err
