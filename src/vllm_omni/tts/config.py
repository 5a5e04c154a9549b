"""The configs of an official Qwen3-TTS checkpoint directory, read and checked before any work.

Why its own module: every shape the loader, the kernels and the decoder use comes from these
files, never from a default, and a user who points the command at the wrong folder should get
one line that names the file and the field. Plain ``json``; no torch.

Read: ``config.json`` (the talker, its code predictor, the token and codec ids, speakers,
languages), ``generation_config.json`` (the sampling defaults; the official loader opens it
unconditionally) and ``speech_tokenizer/config.json`` (the 12 Hz decoder).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.models.spec import Code2WavSpec, ModelSpec, StackSpec

MODEL_TYPES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
SUPPORTED_TYPES = ("custom_voice", "voice_design")
TOKENIZER_12HZ = "qwen3_tts_tokenizer_12hz"

# The official hard defaults (``qwen_tts`` ``_merge_generate_kwargs``); generation_config.json overrides them.
GENERATION_DEFAULTS: dict[str, Any] = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
    "max_new_tokens": 2048,
}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used: the message names the file and the field."""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or a CheckpointError naming the file."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (an official Qwen3-TTS checkpoint directory has it)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


class _Fields:
    """Typed access to one JSON object, each error naming the file and the dotted field."""

    def __init__(self, path: Path, data: dict[str, Any], prefix: str = ""):
        self.path, self.data, self.prefix = path, data, prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def fail(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: field {self._name(key)!r} {why}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.fail(key, "is missing")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(key, f"must be {names}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"must be finite, got {value!r}")
        return value

    def positive(self, key: str, default: Any = ...) -> int:
        value = self.get(key, int, default)
        if value <= 0:
            raise self.fail(key, f"must be a whole number > 0, got {value!r}")
        return value

    def ids(self, key: str) -> dict[str, int]:
        table = self.get(key, dict)
        for name, value in table.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise self.fail(f"{key}.{name}", f"must be a token id (a whole number >= 0), got {value!r}")
        return {str(k).lower(): v for k, v in table.items()}

    def sub(self, key: str) -> "_Fields":
        return _Fields(self.path, self.get(key, dict), f"{self._name(key)}.")


def _stack(f: _Fields, *, hidden_key: str = "hidden_size") -> StackSpec:
    heads = f.positive("num_attention_heads")
    kv_heads = f.positive("num_key_value_heads")
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"must divide num_attention_heads ({heads}), got {kv_heads}")
    hidden = f.positive(hidden_key)
    head_dim = f.positive("head_dim", hidden // heads)
    if f.get("attention_bias", bool, False):
        raise f.fail("attention_bias", "is true; Qwen3-TTS blocks have no attention bias and neither do these kernels")
    act = f.get("hidden_act", str, "silu")
    if act != "silu":
        raise f.fail("hidden_act", f"must be 'silu' (SwiGLU), got {act!r}")
    return StackSpec(layers=f.positive("num_hidden_layers"), hidden=hidden, intermediate=f.positive("intermediate_size"),
                     heads=heads, kv_heads=kv_heads, head_dim=head_dim, rope_theta=f.get("rope_theta", float),
                     rms_eps=f.get("rms_norm_eps", float))


@dataclass(frozen=True)
class CodecIds:
    """The talker's special codec ids (config.json ``talker_config``)."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TextIds:
    """The text tokenizer's special ids the prompt uses (config.json top level)."""

    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults: the official hard defaults overridden by generation_config.json."""

    do_sample: bool
    top_k: int
    top_p: float
    temperature: float
    repetition_penalty: float
    subtalker_dosample: bool
    subtalker_top_k: int
    subtalker_top_p: float
    subtalker_temperature: float
    max_new_tokens: int


@dataclass(frozen=True)
class DecoderConfig:
    """The 12 Hz decoder's shapes (speech_tokenizer/config.json ``decoder_config``)."""

    spec: Code2WavSpec
    heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int
    rope_theta: float
    rms_eps: float


@dataclass(frozen=True)
class CheckpointConfig:
    """Everything the pipeline needs to know about a checkpoint before it reads a weight."""

    path: Path
    model_type: str  # custom_voice | voice_design | base
    size: str  # "0b6", "1b7" (config.json tts_model_size)
    spec: ModelSpec
    text: TextIds
    codec: CodecIds
    speakers: dict[str, int]
    dialects: dict[str, str | bool]
    languages: dict[str, int]
    generation: GenerationDefaults
    decoder: DecoderConfig
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def family(self) -> str:
        """The checkpoint's published name, e.g. ``Qwen3-TTS-12Hz-0.6B-CustomVoice``."""
        size = {"0b6": "0.6B", "1b7": "1.7B"}.get(self.size, self.size)
        return f"Qwen3-TTS-12Hz-{size}-{MODEL_TYPES.get(self.model_type, self.model_type)}"

    @property
    def supported_languages(self) -> list[str]:
        """"auto" and every language but the dialects (which a speaker selects), as the official list."""
        return ["auto"] + sorted(k for k in self.languages if "dialect" not in k)

    @property
    def takes_instruct(self) -> bool:
        """The official code drops the instruction for 0.6B checkpoints."""
        return self.size not in "0b6"


def _generation(path: Path) -> GenerationDefaults:
    f = _Fields(path, read_json(path))
    kinds = {"do_sample": bool, "subtalker_dosample": bool, "top_k": int, "subtalker_top_k": int,
             "max_new_tokens": int}
    values = {k: f.get(k, kinds.get(k, float), v) for k, v in GENERATION_DEFAULTS.items()}
    for key in ("temperature", "subtalker_temperature", "repetition_penalty"):
        if values[key] <= 0:
            raise f.fail(key, f"must be > 0, got {values[key]!r}")
    for key in ("top_p", "subtalker_top_p"):
        if not 0 < values[key] <= 1:
            raise f.fail(key, f"must be in (0, 1], got {values[key]!r}")
    for key in ("top_k", "subtalker_top_k", "max_new_tokens"):
        if values[key] <= 0:
            raise f.fail(key, f"must be a whole number > 0, got {values[key]!r}")
    return GenerationDefaults(**values)


def _decoder(path: Path) -> DecoderConfig:
    top = _Fields(path, read_json(path))
    kind = top.get("model_type", str)
    if kind != TOKENIZER_12HZ:
        raise top.fail("model_type", f"is {kind!r}; only the 12 Hz tokenizer ({TOKENIZER_12HZ!r}) is supported")
    f = top.sub("decoder_config")
    rates = f.get("upsample_rates", list)
    ratios = f.get("upsampling_ratios", list)
    for key, seq in (("upsample_rates", rates), ("upsampling_ratios", ratios)):
        if not seq or not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in seq):
            raise f.fail(key, f"must be a list of whole numbers > 0, got {seq!r}")
    decoder_dim = f.positive("decoder_dim")
    if decoder_dim % 2 ** len(rates):
        raise f.fail("decoder_dim", f"must be divisible by 2**{len(rates)}, got {decoder_dim}")
    heads = f.positive("num_attention_heads")
    hidden = f.positive("hidden_size")
    spec = Code2WavSpec(
        latent_dim=f.positive("latent_dim"), codebook_dim=f.positive("codebook_dim"),
        codebook_size=f.positive("codebook_size"), quantizers=f.positive("num_quantizers"),
        transformer_hidden=hidden, transformer_intermediate=f.positive("intermediate_size"),
        transformer_layers=f.positive("num_hidden_layers"), decoder_dim=decoder_dim,
        upsample_rates=tuple(rates), upsampling_ratios=tuple(ratios),
        sample_rate=top.positive("output_sample_rate", 24_000),
    )
    if spec.codebook_dim % 2:
        raise f.fail("codebook_dim", f"must be even (two halves of the split quantizer), got {spec.codebook_dim}")
    upsample = top.positive("decode_upsample_rate", spec.samples_per_frame)
    if upsample != spec.samples_per_frame:
        raise top.fail("decode_upsample_rate", f"is {upsample}, but the decoder's rates multiply to {spec.samples_per_frame}")
    return DecoderConfig(spec=spec, heads=heads, kv_heads=f.positive("num_key_value_heads", heads),
                         head_dim=f.positive("head_dim", hidden // heads), sliding_window=f.positive("sliding_window"),
                         rope_theta=f.get("rope_theta", float), rms_eps=f.get("rms_norm_eps", float))


def load_config(model_dir: str | Path) -> CheckpointConfig:
    """Read and check a checkpoint directory's configs (no weights); CheckpointError on any fault."""
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (give the folder of an official Qwen3-TTS checkpoint)")
    path = root / "config.json"
    raw = read_json(path)
    top = _Fields(path, raw)
    if top.get("model_type", str) != "qwen3_tts":
        raise top.fail("model_type", f"is {raw.get('model_type')!r}, expected 'qwen3_tts'")
    tokenizer_type = top.get("tokenizer_type", str)
    if tokenizer_type != TOKENIZER_12HZ:
        raise top.fail("tokenizer_type", f"is {tokenizer_type!r}; only the 12 Hz checkpoints ({TOKENIZER_12HZ!r}) are supported")
    model_type = top.get("tts_model_type", str)
    if model_type not in MODEL_TYPES:
        raise top.fail("tts_model_type", f"is {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    if model_type not in SUPPORTED_TYPES:
        raise top.fail("tts_model_type", f"is {model_type!r} ({MODEL_TYPES[model_type]}): voice cloning from reference "
                       "audio (the speaker encoder) is not supported yet; CustomVoice and VoiceDesign checkpoints are")
    t = top.sub("talker_config")
    cp = t.sub("code_predictor_config")
    rope = t.get("rope_scaling", dict, {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise t.fail("rope_scaling.rope_type", f"is {rope.get('rope_type')!r}; only 'default' RoPE is implemented")
    if cp.get("rope_scaling", dict, None):
        raise cp.fail("rope_scaling", "is set; the code predictor uses plain RoPE")
    talker, predictor = _stack(t), _stack(cp)
    groups = t.positive("num_code_groups")
    if cp.positive("num_code_groups", groups) != groups:
        raise cp.fail("num_code_groups", f"must equal talker_config.num_code_groups ({groups})")
    spec = ModelSpec(
        name=top.get("tts_model_size", str), talker=talker, predictor=predictor,
        codec_vocab=t.positive("vocab_size"), codebook_size=cp.positive("vocab_size"), num_code_groups=groups,
        text_vocab=t.positive("text_vocab_size"), text_hidden=t.positive("text_hidden_size"),
        eos_id=t.get("codec_eos_token_id", int),
    )
    codec = CodecIds(pad=t.get("codec_pad_id", int), bos=t.get("codec_bos_id", int), eos=spec.eos_id,
                     think=t.get("codec_think_id", int), nothink=t.get("codec_nothink_id", int),
                     think_bos=t.get("codec_think_bos_id", int), think_eos=t.get("codec_think_eos_id", int))
    for name, value in vars(codec).items():
        if not 0 <= value < spec.codec_vocab:
            raise t.fail(f"codec_{name}_id", f"must be in 0..{spec.codec_vocab - 1}, got {value}")
    text = TextIds(**{k: top.get(f"{k}_token_id", int) for k in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos")})
    for name, value in vars(text).items():
        if not 0 <= value < spec.text_vocab:
            raise top.fail(f"{name}_token_id", f"must be in 0..{spec.text_vocab - 1}, got {value}")
    speakers = t.ids("spk_id") if t.data.get("spk_id") else {}
    languages = t.ids("codec_language_id")
    dialects = {str(k).lower(): v for k, v in (t.get("spk_is_dialect", dict, {}) or {}).items()}
    for table, name in ((speakers, "spk_id"), (languages, "codec_language_id")):
        for key, value in table.items():
            if value >= spec.codec_vocab:
                raise t.fail(f"{name}.{key}", f"must be a codec id below {spec.codec_vocab}, got {value}")
    for spk in speakers:
        if spk not in dialects:
            raise t.fail("spk_is_dialect", f"has no entry for speaker {spk!r} (the official code reads one per speaker)")
        d = dialects[spk]
        if d is not False and d not in languages:
            raise t.fail(f"spk_is_dialect.{spk}", f"names {d!r}, which is not in codec_language_id")
    if model_type == "custom_voice" and not speakers:
        raise t.fail("spk_id", "is empty; a CustomVoice checkpoint names its speakers")
    return CheckpointConfig(
        path=root, model_type=model_type, size=spec.name, spec=spec, text=text, codec=codec, speakers=speakers,
        dialects=dialects, languages=languages, generation=_generation(root / "generation_config.json"),
        decoder=_decoder(root / "speech_tokenizer" / "config.json"), raw=raw,
    )
