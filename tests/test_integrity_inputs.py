"""Hostile-but-fair inputs (issue 14): numbers out of range, names that escape, control characters
that would reach an sbatch file, `module:Class` plugins that are not selectors. Each gets a clear
error naming the key before anything runs, never a traceback and never a silently wrong run.

Most checks call the loaders directly; the CLI ones call `repro.cli.main` in this process (the
same code path as the command, without ~4 s of imports each) and one real subprocess checks the
exit status and stderr of the installed entry point.
"""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from repro.core.config.builder import NAME_MAX_BYTES, ConfigError, numeric_keys, parse_override
from repro.core.config.checks import NUMERIC_RANGES
from repro.core.config.load import from_dict, load_config
from repro.core.config.schema import DataSource, ExperimentConfig
from tests.conftest import CONFIGS, REPO

QUICK = CONFIGS / "demo-quick.yaml"


def _data_with(key: str, value: object) -> dict:
    """A config mapping with one dotted key set; `data.sources[].x` sets it on the first source."""
    data: dict = {}
    if key.startswith("data.sources[]."):
        data["data"] = {"sources": [{"path": "demo", key.rsplit(".", 1)[1]: value}]}
        return data
    cur = data
    parts = key.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return data


def _is_float(key: str) -> bool:
    """Whether the config field named by a NUMERIC_RANGES key is a float (else an int)."""
    cls, hints = ExperimentConfig, None
    for part in key.replace("[]", "").split("."):
        hints = typing.get_type_hints(cls)
        tp = hints[part]
        if typing.get_origin(tp) is list:
            (tp,) = typing.get_args(tp)
        cls = tp
    args = typing.get_args(cls) or (cls,)
    return float in args


# ----------------------------------------------------------------------------- numeric guards


def test_every_numeric_key_of_every_section_has_a_range() -> None:
    """A new int/float key cannot arrive without a guard: every field of every dataclass in
    repro/core/config/schema.py (and of a cluster profile) that takes a number is in NUMERIC_RANGES (RANGES),
    and every shipped default is itself allowed."""
    from slurm.profile import RANGES, ClusterProfile

    keys = numeric_keys(ExperimentConfig)
    assert len(keys) >= 29 and "train.grad_clip" in keys and "data.sources[].limit" in keys
    assert set(keys) == set(NUMERIC_RANGES)
    assert set(numeric_keys(ClusterProfile)) == set(RANGES)
    defaults = ExperimentConfig()
    for key in keys:
        if key.startswith("data.sources[]."):
            value = getattr(DataSource(path="x.json"), key.rsplit(".", 1)[1])
        else:
            value = defaults
            for part in key.split("."):
                value = getattr(value, part)
        assert value is None or not isinstance(value, (int, float)) or NUMERIC_RANGES[key].allows(value), key


@pytest.mark.parametrize("key", sorted(NUMERIC_RANGES))
def test_a_negative_value_is_refused_naming_the_key(key: str) -> None:
    """-1 is wrong for every numeric key (counts, sizes, rates, ports, seeds): the message names
    the key, the value and what is allowed."""
    with pytest.raises(ConfigError) as e:
        from_dict(_data_with(key, -1), source="x.yaml")
    shown = key.replace("[]", "[0]")
    msg = str(e.value)
    assert msg.startswith(f"x.yaml: {shown}: expected "), msg
    assert msg.endswith("got -1.0" if _is_float(key) else "got -1"), msg


@pytest.mark.parametrize("key", sorted(k for k in NUMERIC_RANGES if _is_float(k)))
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e999"])
def test_non_finite_floats_are_refused(key: str, text: str) -> None:
    """`.inf`, `.nan` (YAML) and 1e999 (an override overflowing to inf) never reach training."""
    _, value = parse_override(f"{key}={text}")
    assert isinstance(value, float) and not math.isfinite(value)
    with pytest.raises(ConfigError, match=re.escape(key) + ": expected a finite number"):
        from_dict(_data_with(key, value))


def test_the_issue_cases_name_the_right_key_and_what_is_allowed() -> None:
    cases = {
        "train.grad_clip=-1": "train.grad_clip: expected a finite number > 0 or null "
        "(a gradient-norm cap; null: none), got -1.0",
        "train.lr=.inf": "train.lr: expected a finite number > 0, got inf",
        "train.warmup_steps=-10": "train.warmup_steps: expected an integer >= 0 (optimizer steps), got -10",
        "seed=-1": "seed: expected an integer in [0, 4294967295] (numpy takes seeds below 2**32), got -1",
        # It used to blame model.lora.target_modules (peft's error, after the pool stage).
        "model.lora.dropout=2.0": "model.lora.dropout: expected a finite number in [0, 1) (a "
        "probability), got 2.0",
        "launch.master_port=99999": "launch.master_port: expected an integer in [1, 65535] or "
        "null (a TCP port; null: a free one is chosen), got 99999",
        "launch.torch_threads=-2": "launch.torch_threads: expected an integer >= 1 or null (per "
        "worker; null: cores // world_size), got -2",
        "data.heldout_fraction=1.0": "data.heldout_fraction: expected a finite number in [0, 1) "
        "(a fraction), got 1.0",
        "model.tiny_hidden_size=66": "model.tiny_hidden_size: expected a multiple of 4 (4 heads), got 66",
        "train.weight_decay=-0.1": "train.weight_decay: expected a finite number >= 0, got -0.1",
        "train.keep_checkpoints=-2": "train.keep_checkpoints: expected an integer >= 0 (0 = keep "
        "every checkpoint), got -2",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(QUICK, [override])
        assert str(e.value) == f"{QUICK}: {message}", override
    # eval.limit's wording is the eval stage's own (repro/core/config/checks.py), the facts the same.
    with pytest.raises(
        ConfigError,
        match=r"demo-quick\.yaml: eval\.limit: expected .*>= 1.* "
        r"null.*got 0$",
    ):
        load_config(QUICK, ["eval.limit=0"])


def test_bounds_themselves_and_null_are_accepted_where_allowed() -> None:
    ok = load_config(
        QUICK,
        [
            "seed=4294967295",
            "launch.master_port=65535",
            "launch.torch_threads=1",
            "model.lora.dropout=0.999",
            "train.grad_clip=null",
            "eval.limit=1",
            "train.warmup_steps=0",
            "data.heldout_fraction=0.0",
            "train.keep_checkpoints=0",
            "selection.fraction=1.0",
        ],
    )
    assert ok.launch.master_port == 65535 and ok.train.grad_clip is None
    for bad in (
        "seed=4294967296",
        "launch.master_port=0",
        "launch.master_port=65536",
        "model.lora.dropout=1.0",
        "train.grad_clip=0",
        "selection.fraction=0",
        "train.lr=0",
        "model.lora.alpha=0",
    ):
        key = bad.split("=")[0]
        with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}: expected "):
            load_config(QUICK, [bad])


def test_an_integer_too_large_for_a_float_is_an_error_not_an_overflow() -> None:
    with pytest.raises(
        ConfigError,
        match=r"train\.lr: expected a finite number, got an integer "
        r"of 401 digits",
    ):
        load_config(QUICK, ["train.lr=1" + "0" * 400])


# ----------------------------------------------------------------------------- names and text


@pytest.mark.parametrize(
    "name,why",
    [
        ("../escaped", "path separator"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", "'..'"),
        (".", "'..'"),
        ("x..y", "'..'"),
        ("", "empty"),
        ("  ", "empty"),
        ("x\ny", r"control characters \(\\n\)"),
        ("tab\there", r"control characters \(\\t\)"),
        ("nul\x00", "control characters"),
        ("line\u2028sep", "control characters"),
        ("n" * (NAME_MAX_BYTES + 1), "bytes long"),
    ],
)
def test_names_that_escape_or_break_lines_are_refused(name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"^x\.yaml: name: .* is not allowed: .*{why}"):
        from_dict({"name": name}, source="x.yaml")


def test_ordinary_names_and_grid_cell_ids_are_accepted(tmp_path: Path) -> None:
    for name in (
        "demo-quick",
        "magicoder.codellama-python-7b.cluster-r50.ws4.s42",
        "run 1",
        "résumé_ω",
        "n" * NAME_MAX_BYTES,
    ):
        cfg = from_dict({"name": name, "output_dir": str(tmp_path)})
        assert cfg.run_dir().parent == tmp_path / name  # one folder, inside output_dir


@pytest.mark.parametrize(
    "key,value,shown",
    [
        ("output_dir", "runs\n#SBATCH --x", "output_dir"),
        ("data_dir", "data\r", "data_dir"),
        ("model.name_or_path", "tiny-random-llama\n", "model.name_or_path"),
        ("model.lora.target_modules", ["q_proj", "v_proj\t"], r"model.lora.target_modules\[1\]"),
        ("eval.benchmarks", ["medqa\n"], r"eval.benchmarks\[0\]"),
        ("allocation.method", "cluster-interleave\x1b", "allocation.method"),
    ],
)
def test_control_characters_in_any_setting_are_refused(key: str, value: object, shown: str) -> None:
    data = _data_with(key, value)
    with pytest.raises(ConfigError, match=rf"{shown}: .* contains control characters"):
        from_dict(copy.deepcopy(data))
    src = {"data": {"sources": [{"path": "demo\n"}]}}
    with pytest.raises(ConfigError, match=r"data\.sources\[0\]\.path: .* control characters"):
        from_dict(src)


# ----------------------------------------------------------------------------- plugins

CALLED: list[object] = []


def hostile(**kwargs: object) -> None:
    """Not a selector: a function with a side effect, which must never be called."""
    CALLED.append(kwargs)


class NoSelect:
    """A class, but without select()."""

    def __init__(self, **kwargs: object) -> None:
        CALLED.append(kwargs)


def test_a_module_colon_name_that_is_not_a_selector_is_refused_before_it_is_called() -> None:
    from repro.core.registry import ALLOCATORS, SELECTORS

    with pytest.raises(
        ConfigError,
        match=r"'os:system' resolves to <built-in function system>, "
        r"not a selector class: expected a class with a "
        r"select\(\) method",
    ):
        SELECTORS.get("os:system")
    for name in (f"{__name__}:hostile", f"{__name__}:NoSelect"):
        with pytest.raises(ConfigError, match="not a selector class"):
            SELECTORS.create(name, {"x": 1}, "selection.params")
        with pytest.raises(
            ConfigError,
            match="not an allocator class: expected a class with an "
            r"allocate\(\) method",
        ):
            ALLOCATORS.create(name, {}, "allocation.params")
    assert CALLED == []  # refused by what it is, not by what calling it did
    with pytest.raises(ConfigError, match=r"':Foo': cannot import: ValueError: Empty module name"):
        SELECTORS.get(":Foo")


# ----------------------------------------------------------------------------- through the CLI

ISSUE_CASES = [
    "seed=-1",
    "model.lora.dropout=2.0",
    "launch.master_port=99999",
    "launch.torch_threads=-2",
    "selection.method=os:system",
    "name=../escaped",
    "train.grad_clip=-1",
    "train.lr=.inf",
    "eval.limit=0",
    "train.warmup_steps=-10",
]


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_cli_gives_a_message_and_exit_status_2_and_runs_nothing(
    cmd: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from repro.cli import main

    for case in ISSUE_CASES:
        rc = main([cmd, str(QUICK), f"output_dir={tmp_path}", case])
        err = capsys.readouterr().err
        key = case.split("=")[0]
        assert rc == 2, case
        assert err.startswith("config error: ") and key in err, (case, err)
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no run folder: nothing started
    assert not (tmp_path.parent / "escaped").exists()


def test_cli_subprocess_exit_status_and_no_traceback(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "run",
            str(QUICK),
            f"output_dir={tmp_path}",
            "selection.method=os:system",
            "model.lora.dropout=0.5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert (
        "selection.method: 'os:system' resolves to <built-in function system>, not a "
        "selector class" in p.stderr
    )
    assert "Traceback" not in p.stderr and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- sbatch files

GRID = """name: {name}
base: {base}
grid:
  datasets: {{demo: {{}}}}
  models: {{tiny: {{}}}}
  methods:
    full: {{overrides: [selection.method=full]}}
    cluster: {{overrides: [selection.method=cluster], ratios: {ratios}}}
  world_sizes: [4]
  seeds: [1]
"""


def _grid(tmp_path: Path, name: str = "g", ratios: str = "[50]") -> Path:
    import json

    p = tmp_path / "grid.yaml"
    p.write_text(GRID.format(name=json.dumps(name), base=json.dumps(str(QUICK)), ratios=ratios))
    return p


def test_a_newline_in_a_grid_name_never_becomes_an_sbatch_line(tmp_path: Path) -> None:
    from repro.experiments.experiment import load_experiment
    from slurm.executors import sbatch_script
    from slurm.profile import load_profile

    grid = load_experiment(_grid(tmp_path, "ok-grid"))
    assert len(grid.cells) == 2
    for name, why in [
        ("evil\n#SBATCH --uid=0", "control characters"),
        ("../up", "path separator"),
        ("a/b", "path separator"),
        ("..", "'..'"),
    ]:
        with pytest.raises(ConfigError, match=rf"grid\.yaml: name: .* is not allowed: .*{why}"):
            load_experiment(_grid(tmp_path, name))
    with pytest.raises(ConfigError, match=r"grid\.methods\.cluster\.ratios: '50\\n#x' is not a ratio"):
        load_experiment(_grid(tmp_path, ratios='["50\\n#x"]'))
    with pytest.raises(ConfigError, match=r"grid\.methods\.cluster\.ratios: 150 is not a ratio: .*is 50"):
        load_experiment(_grid(tmp_path, ratios="[150]"))
    # The last check, where submitit writes the file: a job name or folder with a newline.
    prof = load_profile(CONFIGS / "clusters" / "local.yaml")
    text = sbatch_script(prof, 4, "g:cell", tmp_path / "submitit", python="python")
    assert "#SBATCH --job-name=g:cell\n" in text
    with pytest.raises(ConfigError, match=r"sbatch\.job_name: .* contains control characters"):
        sbatch_script(prof, 4, "g\n#SBATCH --uid=0", tmp_path, python="python")
    with pytest.raises(ConfigError, match=r"sbatch\.folder: .* contains control characters"):
        sbatch_script(prof, 4, "g", tmp_path / "a\nb", python="python")


@pytest.mark.parametrize(
    "line,message",
    [
        ('partition: "gpu\\n#SBATCH --qos=high"', r"partition: .* contains control characters \(\\n\)"),
        ('account: "lab\\r"', r"account: .* contains control characters \(\\r\)"),
        ('qos: "a\\tb"', r"qos: .* contains control characters"),
        ('constraint: "a100\\n"', r"constraint: .* contains control characters"),
        ('setup: ["module load x\\n#SBATCH --mem=1"]', r"setup\[0\]: .* contains control characters"),
        ('sbatch_extra: {mail-type: "FAIL\\nX"}', r"sbatch_extra\.mail-type: .* control characters"),
        ('sbatch_extra: {"mail type": FAIL}', r"sbatch_extra: 'mail type' is not an sbatch option"),
        ("sbatch_extra: {exclusive: [1, 2]}", r"sbatch_extra\.exclusive: expected a single value"),
        ('env: {"MY-VAR": "1"}', r"env: 'MY-VAR' is not a shell variable name"),
        ('env: {HF_HOME: "/x\\ny"}', r"env\.HF_HOME: .* contains control characters"),
        ('srun_args: ["--x\\n"]', r"srun_args\[0\]: .* contains control characters"),
        ('output_dir: "/runs\\n"', r"output_dir: .* contains control characters"),
        ("time_limit_min: 0", r"time_limit_min: expected an integer >= 1 \(minutes\), got 0"),
        ("max_requeues: -1", r"max_requeues: expected an integer >= 0, got -1"),
        ("features_gpus: 0", r"features_gpus: expected an integer >= 1 or null"),
        ("features_gpus: two", r"features_gpus: expected int or null, got 'two'"),
        ("mem_per_gpu_gb: .nan", r"mem_per_gpu_gb: expected a finite number > 0 or null"),
        ("gpu: {peak_tflops: .inf}", r"gpu\.peak_tflops: expected a finite number > 0"),
        ("setup: [1]", r"setup\[0\]: expected a string, got 1"),
    ],
)
def test_profile_values_that_would_reach_sbatch_are_checked(tmp_path: Path, line: str, message: str) -> None:
    from slurm.profile import load_profile

    p = tmp_path / "prof.yaml"
    p.write_text(line + "\n")
    with pytest.raises(ConfigError, match=rf"prof\.yaml.*{message}"):
        load_profile(p)


# ----------------------------------------------------------------------------- more hostile input


def test_a_key_given_twice_in_a_yaml_file_is_an_error_not_the_last_one_silently(tmp_path: Path) -> None:
    p = tmp_path / "dup.yaml"
    p.write_text("train: {lr: 0.1}\nseed: 1\ntrain: {lr: 2.0}\n")
    with pytest.raises(
        ConfigError,
        match=r"dup\.yaml: line 3: key 'train' is given twice "
        r"\(first on line 1\); keep one$",
    ):
        load_config(p)
    p.write_text("train:\n  lr: 0.1\n  epochs: 2\n  lr: 2.0\n")
    with pytest.raises(ConfigError, match=r"line 4: key 'lr' is given twice \(first on line 2\)"):
        load_config(p)
    # A YAML merge key overriding an anchor's value is not a duplicate.
    from repro.core.config.builder import read_yaml_file

    p.write_text("base: &b {lr: 1, epochs: 2}\ntrain:\n  <<: *b\n  lr: 3\n")
    assert read_yaml_file(p, "x")["train"] == {"lr": 3, "epochs": 2}


def test_a_file_that_is_not_utf8_text_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00train: 1")
    with pytest.raises(ConfigError, match=r"bin\.yaml: not UTF-8 text \(byte 0\)"):
        load_config(p)


def test_a_raw_control_character_in_an_override_is_refused_not_folded_by_yaml() -> None:
    """YAML folds a raw newline in a plain scalar into a space: `output_dir=a<newline>b` would
    silently become 'a b' (this is how `launch --results` passes its folder on)."""
    import yaml

    assert yaml.safe_load("a\nb") == "a b"  # what used to happen
    with pytest.raises(ConfigError, match=r"override output_dir: .* contains control characters"):
        parse_override("output_dir=a\nb")
    assert parse_override('name="a\\nb"') == ("name", "a\nb")  # an escape: then check_name refuses


def test_malformed_experiment_files_are_errors_not_type_errors(tmp_path: Path) -> None:
    from repro.experiments.experiment import load_experiment

    p = tmp_path / "runs.yaml"
    for body, msg in [
        (f"base: {QUICK}\nruns: 5\n", r"runs: expected a non-empty list of runs \(label, overrides\), got 5"),
        ("base: 5\nruns: [{label: a}]\n", r"base: expected a config file name, got 5"),
        (
            f"base: {QUICK}\noverrides: 5\nruns: [{{label: a}}]\n",
            r"overrides: expected a list of 'key.sub=value' strings, got 5",
        ),
        (
            f"base: {QUICK}\nruns: [{{label: a, overrides: [{{train.lr: 1}}]}}]\n",
            r"runs\[0\]\.overrides: expected a list of 'key.sub=value' strings",
        ),
    ]:
        p.write_text(body)
        with pytest.raises(ConfigError, match=msg):
            load_experiment(p)
    g = _grid(tmp_path)
    g.write_text(g.read_text() + "estimate: 5\n")
    with pytest.raises(ConfigError, match=r"estimate: expected a mapping of dry-run assumptions, got 5"):
        load_experiment(g)


def test_random_seed_offset_must_be_a_seed(tmp_path: Path) -> None:
    from repro.core.registry import SELECTORS

    for bad in (float("inf"), 1.5, -100, True):
        with pytest.raises(
            ConfigError,
            match=r"selection\.params\.seed_offset: expected an integer",
        ):
            SELECTORS.create("random", {"seed_offset": bad}, "selection.params")
    assert SELECTORS.create("random", {"seed_offset": 3}, "selection.params").seed_offset == 3


def test_cli_run_with_a_missing_model_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """ModelLoadError (not a ValueError) used to end `run` with a traceback; preflight now names
    the folder before any stage runs."""
    from repro.cli import main

    missing = tmp_path / "no-such-model"
    rc = main(["run", str(QUICK), f"output_dir={tmp_path / 'runs'}", f"model.name_or_path={missing}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"model.name_or_path: '{missing}' not found" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_range_applies_to_the_number_side_of_a_union() -> None:
    """`int | dict[str, int] | None` (a per-task mapping or one number): the range checks the
    number; null and the mapping are left to the type check and the key's own validation."""
    import dataclasses

    from repro.core.config.builder import Range, check_numbers

    @dataclasses.dataclass
    class Section:
        tokens: int | dict[str, int] | None = None

    check_numbers(Section(None), {"tokens": Range(1)})
    check_numbers(Section({"demo": 0}), {"tokens": Range(1)})
    with pytest.raises(ConfigError, match=r"^x: tokens: expected an integer >= 1 or null, got 0$"):
        check_numbers(Section(0), {"tokens": Range(1)}, "x: ")
    with pytest.raises(ConfigError, match=r"tokens: expected an integer or null, got nan"):
        check_numbers(Section(float("nan")), {})  # no entry: still finite
