"""Model resolution against a fake Hugging Face cache, with the network made unreachable."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import requests
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.utils import filter_repo_objects

from dictation.asr.checkpoints import hub as models
from dictation.asr.checkpoints.hub import (
    ALLOW_PATTERNS,
    IGNORE_PATTERNS,
    KNOWN_MODELS,
    cached_models,
    download_model,
    find_known_model,
    resolve_model,
)
from dictation.asr.errors import ModelError

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to resolve a host name or open a connection fails the test loudly."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def add_to_cache(cache: Path, repo_id: str, files: dict[str, str] | None = None, sha: str = SHA) -> Path:
    """The layout huggingface_hub writes: refs/main holds the commit, snapshots/<commit>/ the files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    for name, content in (files if files is not None else {"config.json": "{}"}).items():
        (snapshot / name).write_text(content)
    return snapshot


# --- known models ----------------------------------------------------------------------------------


def test_known_models_cover_both_sizes_and_both_layouts() -> None:
    ids = [model.repo_id for model in KNOWN_MODELS]
    assert ids == ["Qwen/Qwen3-ASR-0.6B", "Qwen/Qwen3-ASR-1.7B", "Qwen/Qwen3-ASR-0.6B-hf", "Qwen/Qwen3-ASR-1.7B-hf"]
    small, large = find_known_model("Qwen/Qwen3-ASR-0.6B"), find_known_model("Qwen/Qwen3-ASR-1.7B")
    assert small is not None and large is not None
    assert small.label == "Qwen3-ASR-0.6B"
    assert (small.download_gb, large.download_gb) == (1.9, 4.7)
    assert small.vram_gb < large.vram_gb
    assert find_known_model("Qwen/Qwen3-ASR-1.7B-hf").transformers_layout  # type: ignore[union-attr]
    assert find_known_model("someone/else") is None


# --- resolve_model ---------------------------------------------------------------------------------


def test_finds_a_cached_repo_without_the_network(hub_cache: Path, no_network: None) -> None:
    snapshot = add_to_cache(hub_cache, "Qwen/Qwen3-ASR-0.6B")
    resolved = resolve_model("Qwen/Qwen3-ASR-0.6B")
    assert resolved == snapshot
    assert resolved.is_absolute()
    assert (resolved / "config.json").is_file()


def test_hf_home_is_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    snapshot = add_to_cache(tmp_path / "hf-home" / "hub", "Qwen/Qwen3-ASR-1.7B")
    assert resolve_model("Qwen/Qwen3-ASR-1.7B") == snapshot


def test_a_folder_path_is_returned_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_cache: Path, no_network: None
) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(folder) == folder
    assert resolve_model(str(folder)) == folder
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model") == folder


def test_an_existing_folder_wins_over_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_cache: Path, no_network: None
) -> None:
    add_to_cache(hub_cache, "Qwen/Qwen3-ASR-0.6B")
    local = tmp_path / "Qwen" / "Qwen3-ASR-0.6B"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("Qwen/Qwen3-ASR-0.6B") == local


def test_missing_folder(tmp_path: Path, hub_cache: Path, no_network: None) -> None:
    missing = tmp_path / "models" / "nowhere"
    with pytest.raises(ModelError) as excinfo:
        resolve_model(str(missing))
    assert str(excinfo.value) == f"{missing}: no such model folder"
    with pytest.raises(ModelError, match="no such model folder"):
        resolve_model("./not-here")


def test_a_file_is_not_a_model_folder(tmp_path: Path, hub_cache: Path, no_network: None) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelError, match=r"model\.safetensors: not a model folder"):
        resolve_model(str(weights))


def test_uncached_repo_id_says_how_to_download_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: None
) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    add_to_cache(tmp_path / ".cache" / "huggingface" / "hub", "Qwen/Qwen3-ASR-0.6B")  # a different one
    with pytest.raises(ModelError) as excinfo:
        resolve_model("Qwen/Qwen3-ASR-1.7B")
    assert str(excinfo.value) == (
        "Qwen/Qwen3-ASR-1.7B is not in the local Hugging Face cache (~/.cache/huggingface/hub); "
        "run `dictation download Qwen/Qwen3-ASR-1.7B`"
    )


def test_incomplete_cached_snapshot(hub_cache: Path, no_network: None) -> None:
    add_to_cache(hub_cache, "Qwen/Qwen3-ASR-0.6B", files={"vocab.json": "{}"})
    with pytest.raises(ModelError, match=r"incomplete \(no config\.json\); run `dictation download"):
        resolve_model("Qwen/Qwen3-ASR-0.6B")


def test_cached_models_lists_the_known_models_present(hub_cache: Path, no_network: None) -> None:
    assert cached_models() == []
    large = add_to_cache(hub_cache, "Qwen/Qwen3-ASR-1.7B")
    add_to_cache(hub_cache, "Qwen/Qwen3-ASR-0.6B-hf", files={})  # interrupted: not offered
    add_to_cache(hub_cache, "someone/whisper-tiny")  # not ours
    assert cached_models() == [("Qwen/Qwen3-ASR-1.7B", large)]


# --- download_model --------------------------------------------------------------------------------

REPO_FILES = {  # name -> (size, lfs sha256 or None, git oid)
    "config.json": (1_000, None, "c" * 40),
    "generation_config.json": (200, None, "d" * 40),
    "model-00001-of-00002.safetensors": (30_000, "a" * 64, "e" * 40),
    "model-00002-of-00002.safetensors": (10_000, "b" * 64, "f" * 40),
    "model.safetensors.index.json": (500, None, "1" * 40),
    "vocab.json": (2_000, None, "2" * 40),
    "merges.txt": (1_500, None, "3" * 40),
    "tokenizer_config.json": (700, None, "4" * 40),
    "chat_template.json": (300, None, "5" * 40),
    "preprocessor_config.json": (100, None, "6" * 40),
    "pytorch_model.bin": (99_999, "9" * 64, "7" * 40),
    "training_args.pt": (777, None, "8" * 40),
    "README.md": (4_000, None, "0" * 40),
    ".gitattributes": (1_500, None, "a" * 40),
}
WANTED = {name for name in REPO_FILES if not name.endswith((".bin", ".pt", ".md", ".gitattributes"))}


def test_allow_patterns_fetch_what_the_engine_reads_and_never_pickles() -> None:
    fetched = set(filter_repo_objects(list(REPO_FILES), allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    assert fetched == WANTED


class FakeHfApi:
    calls = 0

    def model_info(self, repo_id: str, files_metadata: bool = False) -> SimpleNamespace:
        FakeHfApi.calls += 1
        assert files_metadata

        def sibling(name: str) -> SimpleNamespace:
            size, sha256, oid = REPO_FILES[name]
            lfs = SimpleNamespace(sha256=sha256, size=size) if sha256 else None
            return SimpleNamespace(rfilename=name, size=size, blob_id=oid, lfs=lfs)

        return SimpleNamespace(siblings=[sibling(name) for name in REPO_FILES])


def test_download_reports_byte_progress_and_fetches_only_wanted_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    repo_dir = cache / "models--Qwen--Qwen3-ASR-0.6B"
    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True)
    (blobs / ("c" * 40)).write_bytes(b"x" * 1_000)  # config.json already there from an earlier try
    total = sum(REPO_FILES[name][0] for name in WANTED)
    seen: list[tuple[int, int]] = []
    partial_seen = threading.Event()
    received: dict[str, object] = {}

    def fake_snapshot_download(repo_id: str, **kwargs: object) -> str:
        received.update(kwargs, repo_id=repo_id)
        # Half of the big shard arrives; wait until the caller has reported it, then finish.
        (blobs / ("a" * 64 + ".incomplete")).write_bytes(b"x" * 15_000)
        assert partial_seen.wait(10), "progress was not reported while downloading"
        (blobs / ("a" * 64 + ".incomplete")).rename(blobs / ("a" * 64))
        snapshot = repo_dir / "snapshots" / SHA
        snapshot.mkdir(parents=True)
        return str(snapshot)

    def on_progress(done: int, total_bytes: int) -> None:
        seen.append((done, total_bytes))
        if done == 1_000 + 15_000:
            partial_seen.set()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    monkeypatch.setattr(models, "_POLL_SECONDS", 0.01)

    path = download_model("Qwen/Qwen3-ASR-0.6B", on_progress=on_progress, cache_dir=cache)

    assert path == repo_dir / "snapshots" / SHA
    assert received["repo_id"] == "Qwen/Qwen3-ASR-0.6B"
    assert received["cache_dir"] == str(cache)
    assert received["allow_patterns"] == list(ALLOW_PATTERNS)
    assert {"*.bin", "*.pt"} <= set(received["ignore_patterns"])  # type: ignore[arg-type]
    assert "local_files_only" not in received
    assert all(t == total for _, t in seen)
    assert seen[0][0] >= 1_000  # what was already cached counts as done
    assert (1_000 + 15_000, total) in seen
    assert seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_download_uses_the_env_cache_and_skips_the_file_listing_without_a_callback(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: dict[str, object] = {}

    def fake_snapshot_download(repo_id: str, **kwargs: object) -> str:
        received.update(kwargs)
        return str(hub_cache / "snap")

    class NoListing:
        def __init__(self) -> None:
            raise AssertionError("model_info should not be needed without on_progress")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(huggingface_hub, "HfApi", NoListing)
    assert download_model("Qwen/Qwen3-ASR-1.7B") == hub_cache / "snap"
    assert received["cache_dir"] == str(hub_cache)


def _httpx_like_error(message: str) -> Exception:
    """huggingface_hub >= 1 uses httpx, whose ConnectError is not an OSError."""
    cls = type("ConnectError", (Exception,), {"__module__": "httpx2._transports.default"})
    return cls(message)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RepositoryNotFoundError("404 Client Error.\nRepository Not Found"), "no such model on the Hugging Face Hub"),
        (requests.ConnectionError("Max retries exceeded\nwith url"), "cannot reach the Hugging Face Hub (Max retries"),
        (_httpx_like_error("[Errno -2] Name or service not known"), "cannot reach the Hugging Face Hub ([Errno -2]"),
        (OSError(28, "No space left on device"), "download failed: [Errno 28] No space left on device"),
    ],
)
def test_download_errors_become_one_line_model_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, expected: str
) -> None:
    def failing(repo_id: str, **kwargs: object) -> str:
        time.sleep(0.02)
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(ModelError) as excinfo:
        download_model("Qwen/Qwen3-ASR-1.7B", cache_dir=tmp_path)
    message = str(excinfo.value)
    assert message.startswith("Qwen/Qwen3-ASR-1.7B: ")
    assert expected in message
    assert "\n" not in message


def test_listing_errors_become_model_errors_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Offline:
        def model_info(self, repo_id: str, files_metadata: bool = False) -> None:
            raise huggingface_hub.errors.OfflineModeIsEnabled("offline mode is enabled")

    monkeypatch.setattr(huggingface_hub, "HfApi", Offline)
    with pytest.raises(ModelError, match=r"^someone/model: cannot reach the Hugging Face Hub"):
        download_model("someone/model", on_progress=lambda done, total: None, cache_dir=tmp_path)


def test_download_rejects_a_non_repo_id(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a Hugging Face model id"):
        download_model("/some/folder", cache_dir=tmp_path)
