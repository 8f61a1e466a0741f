"""The speech engine: our PyTorch Qwen3-ASR. No Qt, no transformers (docs/architecture.md, principle 1).

The engine classes are imported on first use, so light modules of this package (errors,
prompt, models) can be imported without loading torch.
"""

from typing import TYPE_CHECKING

from dictation.asr.config import SAMPLE_RATE
from dictation.asr.errors import (
    AdapterError,
    AsrError,
    AudioError,
    LanguageError,
    ModelError,
    RequestError,
    WeightsError,
)

if TYPE_CHECKING:
    from dictation.asr.engine import AsrEngine, EngineOptions, Progress, Transcript

__all__ = [
    "SAMPLE_RATE",
    "AsrEngine",
    "EngineOptions",
    "Progress",
    "Transcript",
    "AdapterError",
    "AsrError",
    "AudioError",
    "LanguageError",
    "ModelError",
    "RequestError",
    "WeightsError",
]

_ENGINE_NAMES = {"AsrEngine", "EngineOptions", "Progress", "Transcript"}


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        from dictation.asr import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'dictation.asr' has no attribute {name!r}")
