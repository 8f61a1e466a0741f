"""The speech engine: our PyTorch Qwen3-ASR. No Qt, no transformers (DESIGN.md §1)."""

from dictation.asr.engine import AsrEngine, EngineOptions, Progress, Transcript
from dictation.asr.errors import AsrError, AudioError, LanguageError, ModelError, WeightsError

__all__ = [
    "AsrEngine",
    "EngineOptions",
    "Progress",
    "Transcript",
    "AsrError",
    "AudioError",
    "LanguageError",
    "ModelError",
    "WeightsError",
]
