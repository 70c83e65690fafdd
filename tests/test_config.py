"""The one typed config: every shipped config validates; mistakes get errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.config.builder import ConfigError, parse_override
from repro.core.config.load import from_dict, load_config
from repro.core.steps import derive
from tests.conftest import CONFIGS

# experiments/, clusters/ and tracks/ hold experiment files, cluster profiles (slurm/) and tracks
# (repro/core/tracks.py), not experiment configs.
SHIPPED = sorted(
    p for p in CONFIGS.rglob("*.yaml") if p.parent.name not in ("experiments", "clusters", "tracks")
)


def test_configs_are_shipped() -> None:
    names = {p.relative_to(CONFIGS).as_posix() for p in SHIPPED}
    assert {"demo.yaml", "demo-quick.yaml", "mini/code.yaml", "mini/medical.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_shipped_config_validates(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.world_size >= 1
    assert len(cfg.hash()) == 12
    # Each config's header says how to run it (torchtune's habit).
    assert "cluster-repro" in path.read_text().split("\n\n")[0]


def test_shipped_mini_configs_point_at_real_files(shared_data: Path) -> None:
    for name in ("mini/code.yaml", "mini/medical.yaml"):
        cfg = load_config(CONFIGS / name)
        for s in cfg.data.sources:
            assert (shared_data / s.path).is_file(), f"{name}: {s.path} not in {shared_data}"


def test_misspelled_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'train.lrr'; did you mean 'train.lr'"):
        from_dict({"train": {"lrr": 1e-4}})
    with pytest.raises(ConfigError, match=r"did you mean 'world_size'"):
        from_dict({"world_sise": 4})


def test_wrong_type_and_value_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"train\.epochs: expected an integer, got 'two'"):
        from_dict({"train": {"epochs": "two"}})
    with pytest.raises(ConfigError, match=r"train\.optimizer: 'adam' is not allowed.*adamw"):
        from_dict({}, ["train.optimizer=adam"])
    with pytest.raises(ConfigError, match=r"selection\.fraction.*not 50"):
        from_dict({}, ["selection.fraction=50"])
    with pytest.raises(ConfigError, match=r"global_batch_size: 10 must be a positive multiple"):
        from_dict({}, ["world_size=4", "train.per_device_batch_size=1", "train.global_batch_size=10"])
    with pytest.raises(ConfigError, match=r"model\.lora\.enabled: expected true or false"):
        from_dict({"model": {"lora": {"enabled": "yes"}}})


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("trian: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: unknown key 'trian'; did you mean 'train'"):
        load_config(typo)


def test_overrides_parse_and_apply() -> None:
    assert parse_override("train.lr=1e-4") == ("train.lr", 1e-4)
    assert parse_override("world_size=8") == ("world_size", 8)
    assert parse_override("model.lora.target_modules=[q_proj,k_proj]") == (
        "model.lora.target_modules",
        ["q_proj", "k_proj"],
    )
    cfg = load_config(
        CONFIGS / "demo.yaml",
        ["train.lr=1e-4", "world_size=8", "train.global_batch_size=32", "selection.params.seed_offset=3"],
    )
    assert cfg.train.lr == 1e-4 and cfg.world_size == 8
    assert cfg.selection.params == {"seed_offset": 3}


def test_hash_is_stable_and_ignores_paths() -> None:
    a = load_config(CONFIGS / "demo.yaml")
    b = load_config(CONFIGS / "demo.yaml", ["output_dir=/elsewhere", "data_dir=/data", "name=x"])
    c = load_config(CONFIGS / "demo.yaml", ["train.lr=0.5"])
    assert a.hash() == b.hash()
    assert a.hash() != c.hash()
    assert a.hash() == load_config(CONFIGS / "demo.yaml").hash()


def test_a_registered_source_s_params_enter_the_hash_in_their_canonical_form() -> None:
    """data.sources[i].params are the source's own typed Params (repro/core/sources.py): a value
    at its default, or an int where a float is asked, is the same run; any other value is not."""
    base = load_config(CONFIGS / "demo-quick.yaml")
    assert base.data.sources[0].params["min_share"] == 0.05  # written out, equal to the default
    same = load_config(
        CONFIGS / "demo-quick.yaml", ["data.sources[0].params={train_size: 96, heldout_per_category: 2}"]
    )
    assert same.hash() == base.hash()
    bigger = load_config(CONFIGS / "demo-quick.yaml", ["data.sources[0].params.train_size=120"])
    assert bigger.data.sources[0].params["train_size"] == 120 and bigger.hash() != base.hash()


def test_data_sources_need_a_path_and_params_belong_to_registered_sources() -> None:
    with pytest.raises(
        ConfigError, match=r"data.sources\[0\].path: required, and not given \(given: format\)"
    ):
        from_dict({"data": {"sources": [{"format": "alpaca"}]}})
    with pytest.raises(ConfigError, match=r"data.sources\[0\].params: 'x.jsonl' is a file or a hub dataset"):
        from_dict({"data": {"sources": [{"path": "x.jsonl", "params": {"n": 1}}]}})
    # A config without data loads (code that reads only its other sections); preflight and the
    # pool stage say that it names no source.
    assert from_dict({}).data.sources == []


def test_an_override_can_index_a_list_that_is_there() -> None:
    cfg = load_config(
        CONFIGS / "demo-quick.yaml", ["data.sources[0].params.train_size=48", "data.sources[0].limit=40"]
    )
    assert cfg.data.sources[0].params["train_size"] == 48 and cfg.data.sources[0].limit == 40
    with pytest.raises(
        ConfigError, match=r"'sources' has 1 item\(s\).*set the whole list: data.sources=\[...\]"
    ):
        load_config(CONFIGS / "demo-quick.yaml", ["data.sources[1].limit=4"])
    with pytest.raises(ConfigError, match=r"'sources' is not a list here"):
        from_dict({}, ["data.sources[0].limit=4"])


def test_report_to_is_not_part_of_the_training_identity() -> None:
    """train.report_to says where the training's scalars are shown, not what is trained: the
    run folder is the same for every choice, while a sibling key of train still counts."""
    a = load_config(CONFIGS / "demo.yaml")
    assert a.train.report_to == "none"
    for choice in ("tensorboard", "wandb", "trackio"):
        b = load_config(CONFIGS / "demo.yaml", [f"train.report_to={choice}"])
        assert b.train.report_to == choice and b.hash() == a.hash() and b.run_dir() == a.run_dir()
    assert (
        load_config(CONFIGS / "demo.yaml", ["train.lr=0.5", "train.report_to=wandb"]).hash()
        == load_config(CONFIGS / "demo.yaml", ["train.lr=0.5"]).hash()
        != a.hash()
    )
    with pytest.raises(ConfigError, match="train.report_to"):
        load_config(CONFIGS / "demo.yaml", ["train.report_to=mlflow"])


def test_eval_settings_are_not_part_of_the_training_identity() -> None:
    from repro.core.config.schema import eval_hash

    a = load_config(CONFIGS / "demo.yaml")
    b = load_config(CONFIGS / "demo.yaml", ["eval.benchmarks=[medqa]", "eval.limit=5"])
    assert a.hash() == b.hash() and a.run_dir() == b.run_dir()
    assert eval_hash(a) != eval_hash(b) and len(eval_hash(a)) == 12
    assert eval_hash(a) == eval_hash(load_config(CONFIGS / "demo.yaml", ["train.lr=0.5"]))


def test_changing_eval_settings_reevaluates_without_retraining(tmp_path: Path, shared_data: Path) -> None:
    """A finished tiny run (1 worker, 2 steps): new eval.limit and eval.benchmarks redo only the
    eval and results stages; train.json, the model and the selection stay as they were."""
    import json

    from repro.core.results import PART_NAME, read_rows
    from repro.core.rundir import stage_marker
    from repro.pipeline import run_experiment

    base = [
        f"output_dir={tmp_path}",
        f"data_dir={shared_data}",
        "world_size=1",
        "data.sources=[{path: demo, params: {train_size: 24, heldout_per_category: 1}}]",
        "train.global_batch_size=2",
        "train.max_steps=2",
        "eval.max_new_tokens=4",
    ]
    cfg = load_config(CONFIGS / "demo-quick.yaml", base)
    run_dir = run_experiment(cfg)
    kept = {
        p: (p.stat().st_mtime_ns, p.read_bytes())
        for p in (
            run_dir / "train.json",
            stage_marker(run_dir, "train"),
            stage_marker(run_dir, "select"),
            run_dir / "selection.json",
            *sorted((run_dir / "model").rglob("*.safetensors")),
        )
    }
    assert len(kept) >= 5

    def rows() -> dict[tuple[str, str], dict[str, str]]:
        return {(r["benchmark"], r["metric"]): r for r in read_rows(run_dir / PART_NAME)}

    first = rows()
    assert first[("demo/overall", "exact_or_exec")]["n"] == "12"  # 12 categories x 1 held-out
    assert json.loads(first[("heldout", "loss")]["eval_settings"])["limit"] is None

    cfg2 = load_config(CONFIGS / "demo-quick.yaml", [*base, "eval.limit=3", "eval.benchmarks=[demo, medqa]"])
    assert run_experiment(cfg2) == run_dir
    for p, (mtime, data) in kept.items():
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data, f"{p} was redone"
    second = rows()
    assert second[("demo/overall", "exact_or_exec")]["n"] == "3"
    assert second[("medqa", "acc")]["n"] == "3"  # lm-eval's limit: the first 3 items
    settings = json.loads(second[("medqa", "acc")]["eval_settings"])
    assert settings["limit"] == 3 and settings["benchmarks"] == ["demo", "medqa"]
    assert {r["config_hash"] for r in second.values()} == {cfg.hash()}
    assert (run_dir / "eval_benchmarks" / "benchmarks.json").is_file()

    # Back to the demo's benchmark alone: the medqa rows and logs go; training is untouched.
    run_experiment(load_config(CONFIGS / "demo-quick.yaml", base))
    assert not any(b == "medqa" for b, _ in rows()) and not (run_dir / "eval_benchmarks").exists()
    assert all(p.stat().st_mtime_ns == m for p, (m, _) in kept.items())


def test_derived_values() -> None:
    cfg = from_dict(
        {}, ["world_size=4", "train.per_device_batch_size=2", "train.global_batch_size=16", "train.epochs=3"]
    )
    d = derive(cfg, n_pool=100, n_selected=50, per_worker_len=13)
    assert d.grad_accum == 2 and d.per_worker_batch == 2
    assert d.steps_per_epoch == 3  # 13 // (2*2), the partial step dropped
    assert d.total_steps == 9
    cfg2 = from_dict({}, ["world_size=4", "train.global_batch_size=64"])
    with pytest.raises(ConfigError, match="fewer than one optimizer step"):
        derive(cfg2, n_pool=10, n_selected=8, per_worker_len=2)
