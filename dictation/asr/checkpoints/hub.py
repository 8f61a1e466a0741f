"""Known Qwen3-ASR models, finding them on disk, and downloading them into the Hugging Face cache.

Why this module exists apart from the engine: resolving a model must never touch the network (the
app starts offline, on a plane, behind a proxy), while downloading must show progress in bytes for
a multi-gigabyte file. Models live in the standard Hugging Face cache so that other tools share
them; we honour HF_HOME / HF_HUB_CACHE as huggingface_hub does, but read them at call time
(huggingface_hub reads them once at import), so a changed environment is seen.

huggingface_hub is imported lazily: it costs ~0.1 s and most commands never download anything.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dictation.asr.checkpoints.locate import (
    FLOAT_DTYPES,
    QUANTIZED_LINEAR,
    CheckpointFiles,
    TensorInfo,
    check_sizes,
    locate,
    our_name,
)
from dictation.asr.config import AsrConfig
from dictation.asr.errors import ModelError
from dictation.files import read_json

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


def check_model_folder(path: str | os.PathLike) -> str | None:
    """None if the engine can load the model at ``path``; else one sentence naming it and the problem.

    ``path`` is a folder, or an ``owner/name`` repo id that is in the local Hugging Face cache (as
    for `resolve_model`, offline; a local folder of that name wins). Meant for a settings window
    checking a folder as the user picks it, so it loads no weights and no tokenizer: it reads
    config.json, the safetensors headers (present, complete, float dtypes, the shapes that the
    config determines, the layer counts) and the tokenizer files' special tokens, in tens of
    milliseconds for a real model. Loading can still fail on what only loading sees (a damaged
    tensor's bytes, too little memory).
    """
    try:
        _check_model_folder(path)
    except ModelError as exc:
        return str(exc)
    return None


def _check_model_folder(path: str | os.PathLike) -> None:
    text = os.fspath(path)
    folder = Path(text).expanduser()
    if isinstance(path, str) and looks_like_repo_id(path) and not folder.is_dir():
        folder = resolve_model(path)  # the cached snapshot; raises if it is not cached
    elif not folder.exists():
        raise ModelError(f"{text}: no such folder")
    elif not folder.is_dir():
        if is_gguf_path(folder):
            return  # a GGUF file: its tensors are checked when it loads
        raise ModelError(f"{text}: this is a file; choose the model folder (the one that holds config.json)")
    config_path = folder / "config.json"
    if not config_path.is_file() and is_gguf_path(folder):
        return  # a folder of GGUF files (a single-file model, or a llama.cpp text model + mmproj)
    if not config_path.is_file():
        raise ModelError(f"{folder}: no config.json in this folder, so it is not a model folder")
    cfg = AsrConfig.from_file(config_path)
    files = locate(folder)
    _check_tensors(files, files.headers(), cfg)
    _check_tokenizer(folder, cfg)


GGUF_MAGIC = b"GGUF"


def is_gguf_path(path: Path) -> bool:
    """A GGUF file, or a folder holding one (by the files' magic bytes; torch-free)."""
    candidates = sorted(path.glob("*.gguf")) if path.is_dir() else [path]
    for candidate in candidates:
        if not candidate.is_file():  # a FIFO or a device would block the read below, and is no model
            continue
        try:
            with open(candidate, "rb") as f:
                if f.read(4) == GGUF_MAGIC:
                    return True
        except OSError:
            continue
    return False


def _check_tensors(files: CheckpointFiles, headers: dict[str, TensorInfo], cfg: AsrConfig) -> None:
    """What load_model would refuse, as far as the headers and the config tell."""
    for name, info in headers.items():
        where = files.tensor_files[name]
        mine = our_name(name, cfg.layout)
        if mine is None:
            raise ModelError(
                f"{where}: tensor {name} does not belong to a Qwen3-ASR checkpoint in the {cfg.layout!r} layout "
                "that config.json describes"
            )
        quantized = cfg.quantization is not None and QUANTIZED_LINEAR.search(mine) is not None
        if info.dtype not in FLOAT_DTYPES and not quantized:
            raise ModelError(f"{where}: tensor {name} is {info.dtype}; only bf16/fp16/fp32 checkpoints load here")
    check_sizes(files, headers, cfg)


def _check_tokenizer(folder: Path, cfg: AsrConfig) -> None:
    """The files load_tokenizer reads exist and hold the control tokens PromptBuilder needs."""
    from dictation.asr.text.tokenizer import ASR_TEXT, AUDIO_END, AUDIO_PAD, AUDIO_START, END_OF_TEXT, IM_END, IM_START

    has_json = (folder / "tokenizer.json").is_file()
    if not has_json:
        present = [name for name in ("vocab.json", "merges.txt") if (folder / name).is_file()]
        if len(present) < 2:
            have = f"only {present[0]}" if present else "no tokenizer files"
            raise ModelError(f"{folder}: {have}; the tokenizer needs tokenizer.json, or vocab.json and merges.txt")
    needed = [IM_START, IM_END, END_OF_TEXT, AUDIO_START, AUDIO_PAD, AUDIO_END, ASR_TEXT]
    config = _read_json(folder / "tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    ids = _token_ids((key, entry) for key, entry in (decoder or {}).items() if isinstance(entry, dict))
    # The big files are parsed only when tokenizer_config.json does not list every control token.
    if any(token not in ids for token in needed):
        if has_json:
            tokenizer = _read_json(folder / "tokenizer.json")
            tokenizer = tokenizer if isinstance(tokenizer, dict) else {}
            model = tokenizer.get("model") if isinstance(tokenizer.get("model"), dict) else {}
            vocab = model.get("vocab") if isinstance(model.get("vocab"), dict) else {}
            added = [e for e in tokenizer.get("added_tokens") or [] if isinstance(e, dict)]
        else:
            vocab, added = _read_json(folder / "vocab.json"), []
        if isinstance(vocab, dict):
            ids |= {token: vocab[token] for token in needed if isinstance(vocab.get(token), int)}
        ids |= _token_ids((entry.get("id"), entry) for entry in added)
    missing = [token for token in needed if token not in ids]
    if missing:
        raise ModelError(f"{folder}: the tokenizer has no {missing[0]} token, so it is not a Qwen3-ASR tokenizer")
    if ids[AUDIO_PAD] != cfg.special.audio_token_id:
        raise ModelError(
            f"{folder}: config.json's audio_token_id is {cfg.special.audio_token_id} but the tokenizer's "
            f"{AUDIO_PAD} is {ids[AUDIO_PAD]}; the tokenizer and config.json come from different models"
        )


def _token_ids(entries) -> dict[str, int]:
    """content -> id for (id, {"content": ...}) pairs; malformed entries are skipped."""
    ids = {}
    for key, entry in entries:
        content = entry.get("content")
        if isinstance(content, str) and str(key).isdigit():
            ids[content] = int(key)
    return ids


def _read_json(path: Path) -> object:
    """The parsed file, None if it does not exist; ModelError naming it if it is not valid JSON."""
    try:
        return read_json(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # not a regular file, too large, not JSON, nested too deeply
        raise ModelError(f"{path}: unreadable ({getattr(exc, 'strerror', None) or exc})") from None


MAX_JSON_BYTES = 512 << 20  # tokenizer.json of a real model: ~11 MB


def cached_models() -> list[tuple[str, Path]]:
    """The known models present in the local cache, as (repo id, snapshot folder), offline."""
    cache = hf_cache_dir()
    found = []
    for model in KNOWN_MODELS:
        snapshot = _cached_snapshot(model.repo_id, cache)
        if snapshot is not None and (snapshot / "config.json").is_file():
            found.append((model.repo_id, snapshot))
    return found


def cached_asr_models(cache: Path | None = None) -> list[tuple[str, Path]]:
    """Every Qwen3-ASR model in the local Hugging Face cache, known or not, as (repo id, snapshot
    folder): the known ones first (in `KNOWN_MODELS` order), then the others by id. Offline; a
    repository counts when its snapshot's config.json is a Qwen3-ASR config (other models in a
    shared cache, LLMs for instance, are left out)."""
    cache = hf_cache_dir() if cache is None else cache
    try:
        names = sorted(entry.name for entry in cache.iterdir() if entry.name.startswith("models--"))
    except OSError:
        return []
    order = {model.repo_id: i for i, model in enumerate(KNOWN_MODELS)}
    found = []
    for name in names:
        repo_id = name[len("models--") :].replace("--", "/", 1)
        if not looks_like_repo_id(repo_id):
            continue
        snapshot = _cached_snapshot(repo_id, cache)
        if snapshot is not None and is_asr_model(snapshot):
            found.append((repo_id, snapshot))
    return sorted(found, key=lambda item: (order.get(item[0], len(order)), item[0].lower()))


def is_asr_model(path: Path) -> bool:
    """A quick look, for menus: a folder whose config.json is a Qwen3-ASR config, or a GGUF file
    (or a folder holding one). Reads no weights; ``check_model_folder`` is the thorough check."""
    try:
        if path.is_dir() and (path / "config.json").is_file():
            AsrConfig.from_dict(json.loads((path / "config.json").read_text(encoding="utf-8")))
            return True
        return path.exists() and is_gguf_path(path)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ModelError):
        return False


@dataclass(frozen=True)
class LocalModel:
    """A model on this computer that can be chosen: ``spec`` is the value for ``engine.model``."""

    spec: str  # a repo id (in the Hugging Face cache) or an absolute folder / file path
    label: str
    path: Path  # where it is on disk
    cached: bool  # in the Hugging Face cache (else a folder or file the user chose)


def local_models(recent: Sequence[str] = ()) -> list[LocalModel]:
    """The models to offer in a menu: every Qwen3-ASR model in the Hugging Face cache, then the
    folders and files of ``recent`` (the settings' recent models) that still hold a model. Offline
    and quick (configs only). A recent folder that is a cache snapshot is listed once, by repo id;
    folders of the same name are told apart by their parent folder."""
    out: list[LocalModel] = []
    seen: set[Path] = set()
    for repo_id, snapshot in cached_asr_models():
        known = find_known_model(repo_id)
        out.append(LocalModel(repo_id, known.label if known else repo_id, snapshot, True))
        seen.add(_real(snapshot))
    folders: list[Path] = []
    for spec in recent:
        path = Path(spec).expanduser()
        if _real(path) in seen or not path.is_absolute() or not is_asr_model(path):
            continue
        seen.add(_real(path))
        folders.append(path)
    names = [path.name for path in folders]
    for path in folders:
        label = path.name if names.count(path.name) == 1 else f"{path.name} ({path.parent.name or path.parent})"
        out.append(LocalModel(str(path), label, path, False))
    return out


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()


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
