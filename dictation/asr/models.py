"""Known Qwen3-ASR models, finding them on disk, and downloading them into the Hugging Face cache.

Why this module exists apart from the engine: resolving a model must never touch the network (the
app starts offline, on a plane, behind a proxy), while downloading must show progress in bytes for
a multi-gigabyte file. Models live in the standard Hugging Face cache so that other tools share
them; we honour HF_HOME / HF_HUB_CACHE as huggingface_hub does, but read them at call time
(huggingface_hub reads them once at import), so a changed environment is seen.

huggingface_hub is imported lazily: it costs ~0.1 s and most commands never download anything.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dictation.asr.errors import ModelError

# What the engine reads: configs, safetensors shards and their index, tokenizer files, templates.
ALLOW_PATTERNS: tuple[str, ...] = ("*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "*.jinja")
# Pickled checkpoints are never fetched, even if a repository adds them later.
IGNORE_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.gguf", "*.onnx", "*.h5")

_POLL_SECONDS = 0.25  # how often download progress is measured on disk
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class KnownModel:
    """A model the app offers by name; sizes are approximate, for choosing on a settings page."""

    repo_id: str
    label: str
    download_gb: float  # bf16 safetensors plus tokenizer files
    vram_gb: float  # bf16 weights plus KV cache and activations for dictation-length audio
    description: str
    transformers_layout: bool = False  # the `-hf` twins: same weights under transformers' names


KNOWN_MODELS: tuple[KnownModel, ...] = (
    KnownModel(
        "Qwen/Qwen3-ASR-0.6B",
        "Qwen3-ASR-0.6B",
        1.9,
        2.5,
        "Small and fast; good accuracy for everyday dictation, runs acceptably on CPU.",
    ),
    KnownModel(
        "Qwen/Qwen3-ASR-1.7B",
        "Qwen3-ASR-1.7B",
        4.7,
        5.5,
        "Most accurate; best with a GPU (about 5 GB of video memory in bf16).",
    ),
    KnownModel(
        "Qwen/Qwen3-ASR-0.6B-hf",
        "Qwen3-ASR-0.6B (transformers layout)",
        1.9,
        2.5,
        "The 0.6B model with transformers-native tensor names; same weights, same results.",
        transformers_layout=True,
    ),
    KnownModel(
        "Qwen/Qwen3-ASR-1.7B-hf",
        "Qwen3-ASR-1.7B (transformers layout)",
        4.7,
        5.5,
        "The 1.7B model with transformers-native tensor names; same weights, same results.",
        transformers_layout=True,
    ),
)


def find_known_model(repo_id: str) -> KnownModel | None:
    """The KNOWN_MODELS entry for ``repo_id``, or None for any other repository."""
    return next((model for model in KNOWN_MODELS if model.repo_id == repo_id), None)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the environment as it is now.

    Same precedence as huggingface_hub: HF_HUB_CACHE, then the legacy HUGGINGFACE_HUB_CACHE, then
    $HF_HOME/hub, with HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface.
    """
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def looks_like_repo_id(spec: str) -> bool:
    """True for ``owner/name`` (Hub naming rules: no '..' or '--', at most 96 characters)."""
    return (
        _REPO_ID.fullmatch(spec) is not None
        and len(spec) <= 96
        and ".." not in spec
        and "--" not in spec
        and not spec.endswith((".", "-"))
    )


def resolve_model(spec: str | os.PathLike) -> Path:
    """Turn a model folder path or a cached repo id into an absolute folder path, offline.

    An existing folder wins (so a local ``Qwen/Qwen3-ASR-1.7B`` checkout is used as is); else an
    ``owner/name`` spec is looked up in the Hugging Face cache without any network access.
    """
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        return path.absolute()
    if isinstance(spec, str) and looks_like_repo_id(spec):
        cache = hf_cache_dir()
        snapshot = _cached_snapshot(spec, cache)
        if snapshot is None:
            raise ModelError(
                f"{spec} is not in the local Hugging Face cache ({_display(cache)}); run `dictation download {spec}`"
            )
        if not (snapshot / "config.json").is_file():
            raise ModelError(
                f"{spec}: the cached copy in {_display(snapshot)} is incomplete (no config.json); "
                f"run `dictation download {spec}`"
            )
        return snapshot
    if path.exists():
        raise ModelError(f"{text}: not a model folder (it is a file; pass the folder that holds config.json)")
    raise ModelError(f"{text}: no such model folder")


def cached_models() -> list[tuple[str, Path]]:
    """The known models present in the local cache, as (repo id, snapshot folder), offline."""
    cache = hf_cache_dir()
    found = []
    for model in KNOWN_MODELS:
        snapshot = _cached_snapshot(model.repo_id, cache)
        if snapshot is not None and (snapshot / "config.json").is_file():
            found.append((model.repo_id, snapshot))
    return found


def download_model(
    repo_id: str,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Fetch the files the engine needs from ``repo_id`` into the cache; return the snapshot folder.

    Resumable: huggingface_hub keeps partial files and skips complete ones. ``on_progress(done,
    total)`` is called in the calling thread, in bytes of the wanted files (those already in the
    cache count as done; ``total`` is 0 if the Hub did not report sizes), ending with
    ``(total, total)``. The download itself runs in a helper thread so progress can be measured;
    an exception raised by ``on_progress`` propagates at once, and that thread is left to finish
    (it is a daemon, so it never keeps the process alive).
    """
    import huggingface_hub

    if not looks_like_repo_id(repo_id):
        raise ModelError(f"{repo_id}: not a Hugging Face model id (expected owner/name)")
    cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    blobs: list[tuple[str, int]] = []
    total = 0
    if on_progress is not None:
        try:
            blobs = _wanted_blobs(repo_id)
        except Exception as e:  # Hub, network and disk failures become one typed line
            mapped = _download_error(repo_id, e)
            if mapped is None:
                raise
            raise mapped from e
        total = sum(size for _, size in blobs)

    outcome: dict[str, object] = {}

    def fetch() -> None:
        try:
            outcome["path"] = huggingface_hub.snapshot_download(
                repo_id,
                cache_dir=str(cache),
                allow_patterns=list(ALLOW_PATTERNS),
                ignore_patterns=list(IGNORE_PATTERNS),
            )
        except BaseException as e:  # handed to the calling thread, which raises it
            outcome["error"] = e

    worker = threading.Thread(target=fetch, name=f"download {repo_id}", daemon=True)
    worker.start()
    blob_dir = cache / f"models--{repo_id.replace('/', '--')}" / "blobs"
    reported = -1
    while worker.is_alive():
        if on_progress is not None:
            done = min(_bytes_on_disk(blob_dir, blobs), total)
            if done != reported:
                on_progress(done, total)
                reported = done
        worker.join(_POLL_SECONDS)
    error = outcome.get("error")
    if isinstance(error, BaseException):
        mapped = _download_error(repo_id, error)
        if mapped is None:
            raise error
        raise mapped from error
    if on_progress is not None:
        on_progress(total, total)
    return Path(str(outcome["path"]))


def _cached_snapshot(repo_id: str, cache: Path) -> Path | None:
    """The snapshot folder huggingface_hub would use for ``repo_id`` at ``main``, without network."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = huggingface_hub.snapshot_download(repo_id, cache_dir=str(cache), local_files_only=True)
    except LocalEntryNotFoundError:
        return None
    return Path(folder).absolute()


def _wanted_blobs(repo_id: str) -> list[tuple[str, int]]:
    """(cache blob name, size) of each file download_model fetches, from the Hub's file listing.

    The cache stores a file as blobs/<sha256> for LFS files and blobs/<git oid> otherwise, and
    downloads it to <blob>.incomplete first: that is what progress measures.
    """
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    info = huggingface_hub.HfApi().model_info(repo_id, files_metadata=True)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    wanted = filter_repo_objects(
        list(siblings), allow_patterns=list(ALLOW_PATTERNS), ignore_patterns=list(IGNORE_PATTERNS)
    )
    blobs = []
    for filename in wanted:
        sibling = siblings[filename]
        name = sibling.lfs.sha256 if sibling.lfs is not None else sibling.blob_id
        if name is not None and sibling.size is not None:
            blobs.append((name, sibling.size))
    return blobs


def _bytes_on_disk(blob_dir: Path, blobs: Sequence[tuple[str, int]]) -> int:
    """Bytes of the wanted blobs already in the cache, counting partial downloads."""
    done = 0
    for name, size in blobs:
        for candidate in (blob_dir / name, blob_dir / f"{name}.incomplete"):
            try:
                done += min(candidate.stat().st_size, size)
                break
            except OSError:
                continue
    return done


# HTTP stacks huggingface_hub has used; their connection errors are not OSError subclasses.
_NETWORK_LIBRARIES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "hf_xet"})


def _download_error(repo_id: str, error: BaseException) -> ModelError | None:
    """A one-line ModelError for Hub, network and disk failures; None for anything else (a bug)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        reason = "the repository is gated; accept its terms on huggingface.co and log in with `hf auth login`"
    elif isinstance(error, RepositoryNotFoundError):
        reason = "no such model on the Hugging Face Hub (or it is private)"
    elif isinstance(error, RevisionNotFoundError):
        reason = "the main revision was not found on the Hugging Face Hub"
    elif isinstance(error, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
        reason = "cannot reach the Hugging Face Hub (offline, or HF_HUB_OFFLINE is set)"
    elif type(error).__module__.split(".")[0] in _NETWORK_LIBRARIES:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        reason = f"cannot reach the Hugging Face Hub ({first_line})"
    elif isinstance(error, (HfHubHTTPError, OSError)):
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        reason = f"download failed: {first_line}"
    else:
        return None
    return ModelError(f"{repo_id}: {reason}")


def _display(path: Path) -> str:
    """``path`` with the home folder shown as ~, as users know the cache location."""
    home = Path.home()
    try:
        return "~/" + path.relative_to(home).as_posix()
    except ValueError:
        return str(path)
