"""Typed errors of the engine. Every message names the file and the problem in one line."""

from __future__ import annotations


class AsrError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelError(AsrError):
    """The model folder is missing, is not Qwen3-ASR, or its files are inconsistent."""


class WeightsError(ModelError):
    """A checkpoint tensor is missing, unexpected, mis-shaped, or the file format is refused."""


class AudioError(AsrError):
    """An audio file cannot be read, or holds no usable audio."""


class LanguageError(AsrError, ValueError):
    """A forced language that the model does not support."""


class RequestError(AsrError, ValueError):
    """A transcription request outside the engine's limits (a context or token budget, asr/limits.py)."""


class AdapterError(AsrError):
    """A LoRA adapter folder is missing, is not a PEFT LoRA adapter, or does not fit the model."""
