"""PEFT LoRA adapters: reading one and checking that it fits a model (applying it: ``tune/adapters.py``).

An adapter folder is what PEFT's ``save_pretrained`` writes:

- ``adapter_config.json``: ``peft_type`` "LORA", ``r``, ``lora_alpha``, ``rank_pattern`` /
  ``alpha_pattern`` (per-module overrides, keys are regular expressions matched against the end of
  a module name), ``use_rslora`` (scale by alpha / sqrt(r) instead of alpha / r), ``use_dora``,
  ``target_modules`` (a list: module-name suffixes; a string: a regular expression over the whole
  name), ``modules_to_save``, ``base_model_name_or_path``;
- ``adapter_model.safetensors``: per adapted linear layer ``base_model.model.<module>.lora_A.weight``
  ``[r, in_features]`` and ``...lora_B.weight`` ``[out_features, r]``; the layer then computes
  ``W x + scaling * B (A x)``. DoRA adds ``...lora_magnitude_vector`` ``[out_features]`` (the layer
  becomes ``m / ||W + scaling B A||_row * (W + scaling B A)``). A module listed in
  ``modules_to_save`` is stored whole under its own name (``base_model.model.<module>.weight``) and
  replaces the model's. A pickled ``adapter_model.bin`` is refused, as pickle checkpoints are.

``<module>`` is the layer's name in the model that PEFT wrapped. Accepted: the official model
(``thinker.model.layers.0.self_attn.q_proj``), the transformers-native ``-hf`` model
(``model.language_model.layers.0...``, ``model.multi_modal_projector.linear_1``) and the thinker
alone (``model.layers.0...``, ``audio_tower...``, ``lm_head``). All become our module names
(``decoder.layers.0.self_attn.q_proj``), so an adapter trained on either layout fits both.

Refused with a message: another ``peft_type``, LoRA on embeddings or convolutions, trained biases
(``bias`` other than "none", ``lora_bias``) and ``fan_in_fan_out`` (these layers are nn.Linear).

Nothing here imports torch or reads tensor data: the checks use the safetensors headers of the
adapter and of the model. The config's regular expressions are matched with a deadline
(``patterns.py``): one that backtracks without end is refused after a few seconds, and never holds
the interpreter lock meanwhile.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dictation.asr.checkpoints.hub import is_gguf_path, resolve_model
from dictation.asr.checkpoints.locate import FLOAT_DTYPES, PREFIXES, TensorInfo, checkpoint_name, locate, read_header
from dictation.asr.config import AsrConfig
from dictation.asr.errors import AdapterError, AsrError, WeightsError
from dictation.asr.limits import MAX_ADAPTER_WEIGHT
from dictation.asr.tune.patterns import (
    FULL,
    SUFFIX,
    PatternError,
    PatternTimeout,
    can_backtrack,
    check_pattern,
    first_matches,
    wrapped,
)
from dictation.files import read_json

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_FILES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
DEFAULT_RANK = 8  # PEFT's LoraConfig defaults, for configs that leave them out
DEFAULT_ALPHA = 8.0
MAX_CONFIG_BYTES = 8 << 20  # adapter_config.json; PEFT's are a few kB (per-layer rank_pattern: tens of kB)
MAX_NAME_CHARS = 500  # a tensor name longer than this is no module of this model
MAX_PATTERNS = 4096  # keys of rank_pattern / alpha_pattern, names in target_modules (a model has ~500 layers)

# (our prefix, PEFT module-name prefix): both checkpoint layouts, then the thinker wrapped alone.
_ADAPTER_PREFIXES = (
    *PREFIXES["thinker"],
    *PREFIXES["hf"],
    ("audio_tower.", "audio_tower."),
    ("decoder.", "model."),
)
_LORA_KEY = re.compile(r"(?:base_model\.model\.)?(?P<module>.+?)\.lora_(?P<part>[AB])(?:\.[\w-]+)?\.weight")
_MAGNITUDE_KEY = re.compile(r"(?:base_model\.model\.)?(?P<module>.+?)\.lora_magnitude_vector(?:\.[\w-]+)?(?:\.weight)?")
_SAVED_KEY = re.compile(
    r"(?:base_model\.model\.)?(?P<module>.+?)(?:\.modules_to_save\.[\w-]+)?\.(?P<param>weight|bias)"
)
_NOT_PLAIN = (
    "only LoRA (with optional DoRA) on linear layers and modules_to_save are supported "
    "(no embedding or convolution LoRA, no bias training)"
)


@dataclass(frozen=True)
class LoraLayer:
    """One adapted linear layer: ``W x + scaling * B (A x)`` (DoRA: renormalised rows, see module doc)."""

    module: str  # our module name, e.g. "decoder.layers.0.self_attn.q_proj"
    lora_a: str  # tensor names in the adapter file
    lora_b: str
    rank: int
    in_features: int
    out_features: int
    scaling: float  # alpha / rank, or alpha / sqrt(rank) with use_rslora
    magnitude: str | None = None  # DoRA's lora_magnitude_vector tensor, if any


@dataclass(frozen=True)
class SavedTensor:
    """A parameter of a module in ``modules_to_save``: it replaces the model's parameter."""

    param: str  # our parameter name, e.g. "lm_head.weight"
    tensor: str  # its name in the adapter file
    shape: tuple[int, ...]


@dataclass(frozen=True)
class AdapterInfo:
    folder: Path
    weights_file: Path
    rank: int  # r; a layer may differ through rank_pattern (see layers)
    alpha: float  # lora_alpha; likewise alpha_pattern
    target_modules: tuple[str, ...]  # the adapted layers' short names, e.g. ("q_proj", "v_proj")
    base_model_name_or_path: str | None
    use_rslora: bool
    layers: tuple[LoraLayer, ...]
    use_dora: bool = False
    saved: tuple[SavedTensor, ...] = ()  # modules_to_save parameters

    @property
    def modules(self) -> tuple[str, ...]:
        """Every module this adapter changes (LoRA layers and saved modules), our names."""
        names = {layer.module for layer in self.layers} | {t.param.rsplit(".", 1)[0] for t in self.saved}
        return tuple(sorted(names))


def parse_adapter_spec(spec: str) -> tuple[str, float]:
    """``"DIR"`` or ``"DIR:WEIGHT"`` -> (DIR, weight). A colon belongs to the path (``C:\\x``) unless what
    follows the last one is a number."""
    path, sep, tail = str(spec).rpartition(":")
    if sep and path:
        try:
            weight = float(tail)
        except ValueError:
            return str(spec), 1.0
        if not math.isfinite(weight):
            raise AdapterError(f"{path}: adapter weight {tail!r} is not a finite number")
        if abs(weight) > MAX_ADAPTER_WEIGHT:
            raise AdapterError(
                f"{path}: adapter weight {tail} is outside -{MAX_ADAPTER_WEIGHT:g} to {MAX_ADAPTER_WEIGHT:g} "
                "(1 applies the adapter as trained; beyond that range its change swamps the model's own weights)"
            )
        return path, weight
    return str(spec), 1.0


def read_adapter(adapter_dir: str | os.PathLike) -> AdapterInfo:
    """Read and validate a PEFT LoRA adapter folder (config and tensor headers; no weights loaded).

    Raises AdapterError with one sentence naming the folder or file and the problem.
    """
    folder = Path(adapter_dir).expanduser()
    if not folder.exists():
        raise AdapterError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise AdapterError(f"{folder}: this is a file; choose the adapter folder (the one that holds {CONFIG_FILE})")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise AdapterError(f"{folder}: no {CONFIG_FILE} in this folder, so it is not a PEFT adapter")
    try:
        config = read_json(config_path, MAX_CONFIG_BYTES)
    except ValueError as exc:  # too large, not UTF-8, not JSON, nested too deeply
        raise AdapterError(f"{config_path}: {exc}") from None
    except OSError as exc:
        raise AdapterError(f"{config_path}: unreadable ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path}: not a JSON object")
    peft_type = config.get("peft_type")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise AdapterError(f"{config_path}: peft_type is {peft_type!r}; only LoRA adapters (LORA) are supported")
    if config.get("fan_in_fan_out"):
        raise AdapterError(
            f"{config_path}: fan_in_fan_out is true, which is for Conv1D layers (GPT-2); "
            "this model's layers are nn.Linear, so the adapter was made for another model"
        )
    bias = config.get("bias", "none")
    if bias not in (None, "none") or config.get("lora_bias"):
        what = f"bias is {bias!r}" if bias not in (None, "none") else "lora_bias is true"
        raise AdapterError(f"{config_path}: {what}; adapters that train biases are not supported")
    rank, alpha = config.get("r", DEFAULT_RANK), config.get("lora_alpha", DEFAULT_ALPHA)
    if not _is_int(rank) or rank < 1:
        raise AdapterError(f"{config_path}: r is {rank!r}; it must be a positive integer")
    if not _is_number(alpha):
        raise AdapterError(f"{config_path}: lora_alpha is {alpha!r}; it must be a number")
    rank_pattern = _pattern_table(config, "rank_pattern", config_path, _is_int)
    alpha_pattern = _pattern_table(config, "alpha_pattern", config_path, _is_number)
    use_rslora = bool(config.get("use_rslora", False))
    use_dora = bool(config.get("use_dora", False))
    targets = config.get("target_modules")
    if targets is not None and not isinstance(targets, (str, list)):
        raise AdapterError(f"{config_path}: target_modules must be a list of names or a regular expression")
    if isinstance(targets, str) and targets != "all-linear":
        try:
            check_pattern(targets)
        except PatternError as exc:
            raise AdapterError(
                f"{config_path}: target_modules is an invalid pattern {_short(targets)} ({exc})"
            ) from None
    if isinstance(targets, list) and not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"{config_path}: target_modules must be a list of names or a regular expression")
    if isinstance(targets, list) and len(targets) > MAX_PATTERNS:
        raise AdapterError(f"{config_path}: target_modules lists {len(targets)} names, more than {MAX_PATTERNS}")
    to_save = config.get("modules_to_save") or []
    if not isinstance(to_save, list) or not all(isinstance(m, str) for m in to_save) or len(to_save) > MAX_PATTERNS:
        raise AdapterError(f"{config_path}: modules_to_save must be a list of module names")
    base = config.get("base_model_name_or_path")

    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        pickles = [folder / name for name in PICKLE_FILES if (folder / name).is_file()]
        if pickles:
            raise AdapterError(
                f"{pickles[0]}: pickle adapters are refused because loading one can run arbitrary code; "
                f"save the adapter as {WEIGHTS_FILE} (PEFT's default, safe_serialization=True)"
            )
        raise AdapterError(f"{folder}: no {WEIGHTS_FILE} in this folder")
    try:
        header = read_header(weights)
    except WeightsError as exc:
        raise AdapterError(str(exc)) from None
    rules = _Rules(
        rank, float(alpha), rank_pattern, alpha_pattern, use_rslora, use_dora, targets, tuple(to_save), config_path
    )
    layers, saved = _layers(weights, header, rules)
    return AdapterInfo(
        folder=folder,
        weights_file=weights,
        rank=rank,
        alpha=float(alpha),
        target_modules=tuple(sorted({layer.module.rsplit(".", 1)[-1] for layer in layers})),
        base_model_name_or_path=base if isinstance(base, str) and base else None,
        use_rslora=use_rslora,
        layers=layers,
        use_dora=use_dora,
        saved=saved,
    )


def check_adapter(adapter_dir: str | os.PathLike, model_folder: str | os.PathLike | None = None) -> str | None:
    """None if ``adapter_dir`` is a LoRA adapter we can use (with ``model_folder``, if given); else one
    sentence naming the folder and the problem.

    With ``model_folder`` (a folder or a cached repo id), every adapted layer must exist in that
    model as a linear layer whose [out_features, in_features] match the adapter's; an adapter for
    another base model is reported as such. A problem with the model folder itself is reported too.
    """
    try:
        info = read_adapter(adapter_dir)
        if model_folder is not None:
            check_fits(info, model_folder)
    except AsrError as exc:  # AdapterError, and ModelError for the model folder
        return str(exc)
    return None


def check_fits(info: AdapterInfo, model_folder: str | os.PathLike) -> None:
    """Raise AdapterError unless every layer of ``info`` fits the model in ``model_folder``.

    Raises ModelError if the model folder cannot be read at all.
    """
    path = Path(os.fspath(model_folder)).expanduser()
    if path.exists() and not (path / "config.json").is_file() and is_gguf_path(path):
        return  # GGUF tensors are only known once the file is parsed; the engine checks them as it loads
    folder = resolve_model(model_folder)
    cfg = AsrConfig.from_file(folder / "config.json")
    shapes = {name: tensor.shape for name, tensor in locate(folder).headers().items()}
    check_shapes(info, lambda ours: _checkpoint_shape(shapes, ours, cfg), f"the model in {folder}")


def check_shapes(info: AdapterInfo, shape_of, where: str) -> None:
    """Raise AdapterError unless every layer and saved tensor of ``info`` fits; ``shape_of(our parameter
    name)`` gives the model's shape or None. ``where`` names the model in messages."""
    origin = f" (it was made for {info.base_model_name_or_path})" if info.base_model_name_or_path else ""
    for layer in info.layers:
        shape = shape_of(f"{layer.module}.weight")
        if shape is None:
            raise AdapterError(
                f"{info.folder}: trained for a different model{origin}: it adapts {layer.module}, "
                f"which {where} does not have"
            )
        if len(shape) != 2:
            raise AdapterError(f"{info.folder}: adapts {layer.module}, which is not a linear layer in {where}")
        if tuple(shape) != (layer.out_features, layer.in_features):
            raise AdapterError(
                f"{info.folder}: trained for a different model{origin}: {layer.module} is {shape[0]}x{shape[1]} "
                f"(out x in) in {where}, but {layer.out_features}x{layer.in_features} in the adapter"
            )
    for saved in info.saved:
        shape = shape_of(saved.param)
        if shape is None:
            raise AdapterError(
                f"{info.folder}: trained for a different model{origin}: it replaces {saved.param}, "
                f"which {where} does not have"
            )
        if tuple(shape) != saved.shape:
            raise AdapterError(
                f"{info.folder}: trained for a different model{origin}: {saved.param} has shape {tuple(shape)} "
                f"in {where}, but {saved.shape} in the adapter"
            )


def _checkpoint_shape(shapes: dict, ours: str, cfg: AsrConfig):
    name = checkpoint_name(ours, cfg.layout)
    if name not in shapes and ours == "lm_head.weight" and cfg.text.tie_word_embeddings:
        name = checkpoint_name("decoder.embed_tokens.weight", cfg.layout)  # the tied head
    shape = shapes.get(name)
    packed = shapes.get(name.removesuffix(".weight") + ".qweight")
    if shape is None and packed is not None:  # an int4 layer of a pre-quantized folder: two values per byte
        shape = (packed[0], 2 * packed[1])
    return shape


@dataclass(frozen=True)
class _Rules:
    rank: int
    alpha: float
    rank_pattern: dict
    alpha_pattern: dict
    use_rslora: bool
    use_dora: bool
    targets: str | list | None
    to_save: tuple[str, ...]
    config_path: Path


def _layers(
    path: Path, header: dict[str, TensorInfo], rules: _Rules
) -> tuple[tuple[LoraLayer, ...], tuple[SavedTensor, ...]]:
    """Pair every module's lora_A and lora_B tensors, check them against the config, and collect
    the modules_to_save parameters."""
    pairs: dict[str, dict[str, str]] = {}
    magnitudes: dict[str, str] = {}
    saved: list[SavedTensor] = []
    saved_modules: set[str] = set()  # the modules_to_save found, as named in the file
    for name in sorted(header):
        if len(name) > MAX_NAME_CHARS:
            raise AdapterError(f"{path}: holds a tensor named {_short(name)}, which is no module of a Qwen3-ASR model")
        if header[name].dtype not in FLOAT_DTYPES:
            raise AdapterError(f"{path}: tensor {name} is {header[name].dtype}; only bf16/fp16/fp32 adapters load")
        if match := _LORA_KEY.fullmatch(name):
            pairs.setdefault(match["module"], {})[match["part"]] = name
        elif match := _MAGNITUDE_KEY.fullmatch(name):
            if not rules.use_dora:
                raise AdapterError(f"{path}: holds {name}, a DoRA magnitude, but {CONFIG_FILE} has no use_dora")
            magnitudes[match["module"]] = name
        elif (match := _SAVED_KEY.fullmatch(name)) and _is_listed(match["module"], rules.to_save):
            ours = _our_module(match["module"])
            if ours is None:
                raise AdapterError(
                    f"{path}: trained for a different model: {match['module']} is not a module of a Qwen3-ASR model"
                )
            saved.append(SavedTensor(f"{ours}.{match['param']}", name, tuple(header[name].shape)))
            saved_modules.add(match["module"])
        else:
            raise AdapterError(f"{path}: holds {name}, which is not a LoRA tensor; {_NOT_PLAIN}")
    for listed in rules.to_save:  # PEFT saves each listed module whole; one it lacks would be ignored
        if not any(_is_listed(module, [listed]) for module in saved_modules):
            raise AdapterError(
                f"{rules.config_path}: modules_to_save lists {_short(listed)}, but {path.name} holds no weights "
                "of such a module (no module of that name in the model it was trained on?)"
            )
    if not pairs and not saved:
        raise AdapterError(f"{path}: holds no LoRA weights")
    selected, ranks, alphas = _match_patterns(sorted(pairs), rules)
    layers = []
    for module, parts in pairs.items():
        if len(parts) < 2:
            have, lack = ("lora_A", "lora_B") if "A" in parts else ("lora_B", "lora_A")
            raise AdapterError(f"{path}: {module} has {have} but no {lack}")
        ours = _our_module(module)
        if ours is None:
            raise AdapterError(f"{path}: trained for a different model: {module} is not a layer of a Qwen3-ASR model")
        a, b = header[parts["A"]].shape, header[parts["B"]].shape
        if len(a) != 2 or len(b) != 2:
            raise AdapterError(
                f"{path}: {module} has {max(len(a), len(b))}-D LoRA matrices; only LoRA on linear layers is supported"
            )
        if a[0] != b[1]:
            raise AdapterError(f"{path}: {module}'s lora_A has rank {a[0]} but its lora_B has rank {b[1]}")
        if not selected[module]:
            raise AdapterError(f"{path}: holds LoRA weights for {module}, which target_modules does not select")
        expected = ranks[module]
        if a[0] != expected:
            raise AdapterError(f"{path}: {module} has rank {a[0]}, but {CONFIG_FILE} says r={expected}")
        magnitude = magnitudes.pop(module, None)
        if rules.use_dora:
            if magnitude is None:
                raise AdapterError(f"{path}: {module} has no lora_magnitude_vector, but {CONFIG_FILE} says use_dora")
            if tuple(header[magnitude].shape) != (b[0],):
                raise AdapterError(
                    f"{path}: {module}'s lora_magnitude_vector has shape {tuple(header[magnitude].shape)}, "
                    f"expected ({b[0]},)"
                )
        layer_alpha = alphas[module]
        scaling = layer_alpha / (math.sqrt(a[0]) if rules.use_rslora else a[0])
        layers.append(LoraLayer(ours, parts["A"], parts["B"], a[0], a[1], b[0], scaling, magnitude))
    if magnitudes:
        module = next(iter(magnitudes))
        raise AdapterError(f"{path}: {module} has a lora_magnitude_vector but no lora_A/lora_B")
    return tuple(sorted(layers, key=lambda layer: layer.module)), tuple(sorted(saved, key=lambda t: t.param))


def _match_patterns(modules: list[str], rules: _Rules) -> tuple[dict[str, bool], dict[str, int], dict[str, float]]:
    """Per module: whether target_modules selects it, its rank and its alpha (PEFT's rules, below).

    - target_modules: a list matches a name or a name suffix at a dot; a string is a regular
      expression over the whole name ("all-linear" selects every linear layer);
    - rank_pattern / alpha_pattern: the first key that matches the end of the name at a name
      boundary gives the value, else r / lora_alpha.

    The expressions are matched with a deadline (patterns.py); one that does not finish is
    refused with the key it is in.
    """
    targets = rules.targets
    tables = [(SUFFIX, list(rules.rank_pattern)), (SUFFIX, list(rules.alpha_pattern))]
    keys = ["rank_pattern", "alpha_pattern"]
    if isinstance(targets, str) and targets != "all-linear":
        tables.append((FULL, [targets]))
        keys.append("target_modules")
    try:
        found = first_matches(tables, modules)
    except PatternTimeout as exc:
        slow = "; ".join(
            f"{keys[i]} {', '.join(_short(p) for p in tables[i][1] if can_backtrack(p))}" for i in exc.tables
        )
        raise AdapterError(
            f"{rules.config_path}: its regular expressions did not finish matching the module names within "
            f"a few seconds ({slow}); a pattern that backtracks without end, such as a nested quantifier "
            "like (.*)*, must be simplified"
        ) from None
    except PatternError as exc:
        raise AdapterError(f"{rules.config_path}: {exc}") from None
    rank_keys, alpha_keys = list(rules.rank_pattern), list(rules.alpha_pattern)
    selected, ranks, alphas = {}, {}, {}
    for j, module in enumerate(modules):
        if targets is None or targets == "all-linear":
            selected[module] = True
        elif isinstance(targets, str):
            selected[module] = found[2][j] is not None
        else:
            selected[module] = _is_listed(module, targets)
        rank_at, alpha_at = found[0][j], found[1][j]
        ranks[module] = rules.rank if rank_at is None else rules.rank_pattern[rank_keys[rank_at]]
        alphas[module] = rules.alpha if alpha_at is None else rules.alpha_pattern[alpha_keys[alpha_at]]
    return selected, ranks, alphas


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters (patterns and names from files can be huge)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _is_listed(module: str, names) -> bool:
    """PEFT's rule for a list of names: ``module`` is one of them or ends with ``.name``."""
    parts = module.split(".")
    listed = set(names)
    return any(".".join(parts[i:]) in listed for i in range(len(parts)))


def _our_module(module: str) -> str | None:
    """Our module name for a PEFT module name in any accepted layout (see the module docstring)."""
    tensor = f"{module}.weight"  # map as a tensor name, so "lm_head" meets the "lm_head." prefix
    for mine, theirs in _ADAPTER_PREFIXES:
        if tensor.startswith(theirs):
            return (mine + tensor[len(theirs) :]).removesuffix(".weight")
    return None


def _pattern_table(config: dict, key: str, path: Path, valid) -> dict:
    table = config.get(key) or {}
    if not isinstance(table, dict) or not all(valid(v) for v in table.values()):
        raise AdapterError(f"{path}: {key} must map module-name patterns to numbers")
    if len(table) > MAX_PATTERNS:
        raise AdapterError(f"{path}: {key} has {len(table)} patterns, more than {MAX_PATTERNS}")
    for pattern in table:
        try:
            check_pattern(wrapped(pattern, SUFFIX))
        except PatternError as exc:
            raise AdapterError(f"{path}: {key} has an invalid pattern {_short(pattern)} ({exc})") from None
    return table


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
