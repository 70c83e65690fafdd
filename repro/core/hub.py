"""Hub inputs: the commit a hub model's or dataset's revision resolves to, and how a changed one
is described (repro/core/fingerprints.py records them; models.py and data.py check them before a
download).

A hub model or dataset is named by a repository and a revision (a branch, a tag or a commit:
model.revision, data.sources[].revision; null: the default branch, "main"). What it resolves to,
the commit, is recorded in the stage's fingerprint and the rows' provenance, so a re-upload to a
branch shows as a changed input (the run stops, like a changed file) and every row says which
version it used.

Where the hub may be asked (HF_HUB_OFFLINE unset), the hub at HF_ENDPOINT is asked, first and
every time: a local cache's `refs/<revision>` is where the branch pointed at the last download, not
where it points now. Offline, that cached ref is the answer (None where nothing was downloaded).
A hub that cannot be reached, or a repository or revision it does not have, is a HubError naming
HF_ENDPOINT: one request, bounded by HF_HUB_ETAG_TIMEOUT (seconds), no retries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from repro.core.errors import UserError

_TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub's spellings of a set flag


class HubError(UserError, RuntimeError):
    """A hub repository or revision that is not there, or a hub that cannot be reached; the
    message names the repository, the revision and HF_ENDPOINT. `missing`: "revision",
    "repository", or "" (the hub could not answer)."""

    def __init__(self, message: str, missing: str = "") -> None:
        super().__init__(message)
        self.missing = missing


def _hex40(s: str | None) -> bool:
    return s is not None and len(s) == 40 and all(c in "0123456789abcdef" for c in s)


def hub_offline() -> bool:
    """Whether the hub may not be asked: HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE, as
    huggingface_hub reads them) set now, or when huggingface_hub was imported (it then refuses)."""
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    if flag.upper() in _TRUE:
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return True
    return bool(constants.HF_HUB_OFFLINE)


def _cached_commit(kind: str, repo: str, revision: str | None) -> str | None:
    """The commit the local hub cache last downloaded `revision` at (`refs/<revision>`), or None."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    ref = Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo.replace('/', '--')}" / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if _hex40(commit) else None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _refs(api: Any, kind: str, repo: str) -> str:
    """'; branches: main, dev; tags: v1' of a repository, or '' when the hub does not say."""
    try:
        refs = api.list_repo_refs(repo, repo_type=kind)
    except Exception:  # noqa: BLE001 - only a hint in an error message
        return ""
    names = lambda items: ", ".join(sorted(r.name for r in items)) or "none"  # noqa: E731
    return f"; branches: {names(refs.branches)}; tags: {names(refs.tags)}"


def _ask_hub(kind: str, repo: str, revision: str | None) -> str:
    """The commit `revision` of `repo` is at now, from the hub at HF_ENDPOINT (HubError if not)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi()
    info = api.model_info if kind == "model" else api.dataset_info
    rev, where, timeout = (
        revision or "main",
        f"HF_ENDPOINT={constants.ENDPOINT}",
        constants.HF_HUB_ETAG_TIMEOUT,
    )
    try:
        sha = info(repo, revision=rev, timeout=timeout).sha
    except (RevisionNotFoundError, RepositoryNotFoundError) as e:
        # Some hub servers (olah) answer an unknown revision as an unknown repository: whether
        # the default branch is there tells the two apart.
        exists = isinstance(e, RevisionNotFoundError)
        if not exists and rev != "main":
            try:
                exists = bool(info(repo, revision="main", timeout=timeout).sha)
            except Exception:  # noqa: BLE001 - then it is the repository that is missing
                exists = False
        if exists:
            raise HubError(
                f"{kind} {repo!r}: revision {rev!r} not found at {where} (the repository is there"
                f"{_refs(api, kind, repo)}); set a branch, tag or commit it has",
                "revision",
            ) from None
        raise HubError(
            f"{kind} {repo!r} not found at {where} (or it is private or gated: set HF_TOKEN or "
            "run `hf auth login`); check the id",
            "repository",
        ) from None
    except HfHubHTTPError as e:
        raise HubError(
            f"the hub at {where} answered {kind} {repo!r} (revision {rev!r}) with an error: {_first_line(e)}"
        ) from None
    except Exception as e:  # noqa: BLE001 - connection refused, timeout, DNS, proxy: unreachable
        raise HubError(
            f"cannot reach the hub at {where} to look up {kind} {repo!r} (revision {rev!r}): "
            f"{type(e).__name__}: {_first_line(e)}. Start the hub mirror or point HF_ENDPOINT at "
            "one that is up, or set HF_HUB_OFFLINE=1 to use only what the local hub cache holds"
        ) from None
    if not sha:
        raise HubError(f"the hub at {where} gave no commit for {kind} {repo!r} (revision {rev!r})")
    return str(sha)


def _resolve_hub_commit(kind: str, repo: str, revision: str | None) -> str | None:
    """The commit `revision` of hub `repo` (kind "model" or "dataset") is at: the hub's answer
    where it may be asked (HubError when it cannot answer), else the local cache's, else None
    (offline, a commit is its own answer)."""
    if not hub_offline():
        return _ask_hub(kind, repo, revision)
    if _hex40(revision):
        return revision
    return _cached_commit(kind, repo, revision)


_HUB_RESOLVER = _resolve_hub_commit


def set_hub_resolver(fn: Any) -> Any:
    """Replace how hub commits are looked up (tests: a fake hub); returns the previous one."""
    global _HUB_RESOLVER
    old, _HUB_RESOLVER = _HUB_RESOLVER, fn
    return old


def hub_commit(kind: str, repo: str, revision: str | None) -> str | None:
    """The commit a hub model or dataset resolves to now (None: it cannot be looked up here,
    offline); HubError when the hub is asked and cannot say."""
    return _HUB_RESOLVER(kind, repo, revision)


def checked_hub_commit(
    kind: str, repo: str, revision: str | None, path_key: str, revision_key: str
) -> str | None:
    """hub_commit, with a HubError's message led by the config key to fix: `revision_key` for a
    revision the repository does not have, else `path_key` (the key naming the repository)."""
    try:
        return hub_commit(kind, repo, revision)
    except HubError as e:
        key = revision_key if e.missing == "revision" else path_key
        raise HubError(f"{key}: {e}", e.missing) from None


def hub_changes(label: str, old: dict[str, Any], now: str | None, key: str) -> list[str]:
    """A hub input whose revision resolves to another commit than the one recorded."""
    was = old.get("commit")
    if not was or not now or was == now:
        return []
    rev = old.get("revision") or "main"
    return [
        f"{label} (revision {rev!r}) now resolves to commit {now[:12]}, the stage was made from "
        f"{was[:12]}: the hub repository changed. Set {key} to {was} to keep using the old one"
    ]
