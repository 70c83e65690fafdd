"""Tokenizing Examples for training: `tokenize_example` (one Example: prompt tokens, response
tokens, eos; labels IGNORE_INDEX on the prompt), `TokenizedPool` (a Pool tokenized once, in
batches, with bad rows stopped or skipped and counted) and `collate` (right-padded int64 tensors).
repro/core/data.py loads the Pools they tokenize.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from repro.core.errors import UserValueError
from repro.core.log import get_logger
from repro.core.prompts import DataError
from repro.core.types import Example, Pool

logger = get_logger("data")  # the same unit as the loading: one source of log lines for data

__all__ = ["IGNORE_INDEX", "tokenize_example", "TokenizedPool", "collate"]

IGNORE_INDEX = -100  # label value the loss ignores (prompt and padding positions)


def _encode_prompts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    # Prompts get the tokenizer's default specials (BOS for Llama-style tokenizers), but only the
    # leading ones: a tokenizer that appends EOS by default must not end the prompt with it.
    with_sp = tokenizer(texts, add_special_tokens=True)["input_ids"]
    plain = tokenizer(texts, add_special_tokens=False)["input_ids"]
    out = []
    for w, p in zip(with_sp, plain):
        n = len(p)
        for start in range(len(w) - n + 1):
            if w[start : start + n] == p:
                w = w[: start + n]
                break
        out.append(list(w))
    return out


def _assemble(
    ex_id: str, prompt: list[int], response: list[int], eos: int, max_length: int
) -> dict[str, Any]:
    ids = (prompt + response + [eos])[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt) + response + [eos])[:max_length]
    n_resp = len(ids) - len(prompt)
    if n_resp <= 0:
        raise DataError(
            f"example {ex_id!r}: the prompt is {len(prompt)} tokens, so no response token "
            f"fits in data.max_length={max_length}; raise data.max_length or skip such "
            "examples (on_bad_row=skip)"
        )
    return {"input_ids": ids, "labels": labels, "n_response_tokens": n_resp}


def _eos(tokenizer: Any) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(
            "the tokenizer has no eos token; responses must end with one (set tokenizer.eos_token)"
        )
    return int(eos)


def tokenize_example(ex: Example, tokenizer: Any, max_length: int) -> dict:
    """input_ids = prompt tokens + response tokens + eos; labels = -100 on prompt positions, the
    token ids on response positions (eos included). The concatenation is cut from the right at
    max_length tokens (the prompt is never cut from the left); if no response token survives,
    DataError (example id, prompt length, max_length). Returns {"input_ids", "labels",
    "n_response_tokens"}. No BOS unless the tokenizer adds one by default; prompt and response
    are tokenized separately and concatenated, so the label boundary is exact."""
    (p,) = _encode_prompts(tokenizer, [ex.prompt])
    r = tokenizer(ex.response, add_special_tokens=False)["input_ids"]
    return _assemble(ex.id, p, list(r), _eos(tokenizer), max_length)


class TokenizedPool:
    """A Pool's examples tokenized once, in pool order. `tp["some-id"]` (or `tp[k]` by position)
    gives the `tokenize_example` dict. Examples with no response token left after truncation
    raise DataError (on_bad_row="error") or are skipped and counted in `.skipped` ("skip")."""

    def __init__(
        self, pool: Pool, tokenizer: Any, max_length: int, on_bad_row: str = "error", batch_size: int = 512
    ):
        if on_bad_row not in ("error", "skip"):
            raise UserValueError(f"on_bad_row: expected 'error' or 'skip', got {on_bad_row!r}")
        self.max_length = max_length
        self.skipped: dict[str, int] = {}
        self._items: dict[str, dict[str, Any]] = {}
        self.ids: list[str] = []
        eos = _eos(tokenizer)
        exs = pool.examples
        for s in range(0, len(exs), batch_size):  # batched: fast tokenizers parallelize a batch
            chunk = exs[s : s + batch_size]
            prompts = _encode_prompts(tokenizer, [e.prompt for e in chunk])
            resps = tokenizer([e.response for e in chunk], add_special_tokens=False)["input_ids"]
            for ex, p, r in zip(chunk, prompts, resps):
                try:
                    item = _assemble(ex.id, p, list(r), eos, max_length)
                except DataError:
                    if on_bad_row == "error":
                        raise
                    self.skipped["no_response_tokens"] = self.skipped.get("no_response_tokens", 0) + 1
                    continue
                self._items[ex.id] = item
                self.ids.append(ex.id)
        if self.skipped:
            logger.warning(
                f"tokenization skipped {self.skipped['no_response_tokens']} of "
                f"{len(exs)} examples whose prompt leaves no response token within "
                f"max_length={max_length}"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, ex_id: object) -> bool:
        return ex_id in self._items

    def __getitem__(self, key: str | int) -> dict[str, Any]:
        if isinstance(key, int):
            key = self.ids[key]
        try:
            return self._items[key]
        except KeyError:
            raise KeyError(
                f"example id {key!r} is not in this TokenizedPool "
                f"({len(self.ids)} examples; skipped: {self.skipped or 'none'})"
            ) from None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._items[i] for i in self.ids)


def collate(batch: list[dict], pad_token_id: int) -> dict[str, Any]:
    """Right-pad to the longest in the batch: input_ids (pad_token_id), labels (-100),
    attention_mask (1 on real tokens). Returns int64 tensors of shape (batch, longest)."""
    import torch  # lazy: loading data does not need torch

    if not batch:
        raise ValueError("collate: empty batch")
    if pad_token_id is None:
        raise DataError("the tokenizer has no pad token id; set tokenizer.pad_token (e.g. to eos)")
    n = max(len(b["input_ids"]) for b in batch)
    input_ids = torch.full((len(batch), n), int(pad_token_id), dtype=torch.long)
    labels = torch.full((len(batch), n), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for k, b in enumerate(batch):
        m = len(b["input_ids"])
        input_ids[k, :m] = torch.tensor(b["input_ids"], dtype=torch.long)
        labels[k, :m] = torch.tensor(b["labels"], dtype=torch.long)
        mask[k, :m] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}
