"""The configs of an official Qwen3-TTS checkpoint directory, read and checked before any work.

Why its own module: every shape the loader, the kernels and the decoder use comes from these
files, never from a default, and a user who points the command at the wrong folder should get
one line that names the file and the field. Plain ``json``; no torch.

Read: ``config.json`` (the talker, its code predictor, the token and codec ids, speakers,
languages; a Base checkpoint's speaker encoder), ``generation_config.json`` (the sampling
defaults; the official loader opens it unconditionally) and ``speech_tokenizer/config.json``
(the 12 Hz decoder; for a Base checkpoint its encoder too, which turns reference audio into codes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.models.spec import Code2WavSpec, ModelSpec, StackSpec

MODEL_TYPES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
# The 12 Hz encoder's config is a transformers ``MimiConfig``: the official code builds it from
# ``encoder_config`` with that class's defaults (transformers 4.57.3) for the fields it omits.
MIMI_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1, "hidden_size": 512, "num_filters": 64,
    "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3,
    "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant",
    "compress": 2, "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32, "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1, "num_hidden_layers": 8,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": None,
    "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": 10000.0, "layer_scale_initial_scale": 0.01,
}
# The official ``Qwen3TTSSpeakerEncoderConfig`` defaults (qwen-tts 0.1.1), for the fields a Base config omits.
SPEAKER_ENCODER_DEFAULTS: dict[str, Any] = {
    "mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536], "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 128, "enc_res2net_scale": 8, "enc_se_channels": 128,
    "sample_rate": 24000,
}
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
class SpeakerEncoderConfig:
    """A Base checkpoint's ECAPA-TDNN speaker encoder (config.json ``speaker_encoder_config``)."""

    mel_dim: int
    dim: int  # the embedding's size: the talker's hidden size
    channels: tuple[int, ...]  # the first TDNN, the SE-Res2Net blocks, the aggregation
    kernels: tuple[int, ...]
    dilations: tuple[int, ...]
    attention_channels: int
    res2net_scale: int
    se_channels: int
    sample_rate: int


@dataclass(frozen=True)
class SpeechEncoderConfig:
    """The 12 Hz encoder of a Base checkpoint's speech tokenizer (speech_tokenizer/config.json
    ``encoder_config``, a Mimi encoder): SEANet convolutions, a transformer, a stride-2 downsample
    and the split residual quantizer, of which the first ``valid_quantizers`` codebooks are kept."""

    sample_rate: int
    filters: int
    ratios: tuple[int, ...]  # the downsampling strides, last first as in the config (applied reversed)
    residual_layers: int
    kernel: int
    last_kernel: int
    residual_kernel: int
    dilation_growth: int
    compress: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    norm_eps: float
    codebook_size: int
    codebook_dim: int
    quantizers: int
    semantic_quantizers: int
    valid_quantizers: int
    frame_rate: float

    @property
    def hop(self) -> int:
        """Samples per frame of the SEANet's output (before the stride-2 downsample)."""
        return math.prod(self.ratios)

    @property
    def samples_per_frame(self) -> int:
        return self.hop * self.downsample_stride

    @property
    def downsample_stride(self) -> int:
        return 2

    @property
    def downsample_kernel(self) -> int:
        return 2 * int(math.ceil(self.sample_rate / self.hop) / self.frame_rate)


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
    speaker_encoder: SpeakerEncoderConfig | None = None  # Base only
    speech_encoder: SpeechEncoderConfig | None = None  # Base only
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def clones(self) -> bool:
        """Whether this checkpoint speaks in a voice cloned from reference audio (a Base checkpoint)."""
        return self.model_type == "base"

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


def _whole_list(f: _Fields, key: str, default: list[int], n: int | None = None) -> tuple[int, ...]:
    seq = f.get(key, list, default)
    if not seq or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in seq) or (
            n is not None and len(seq) != n):
        size = f" of {n}" if n is not None else ""
        raise f.fail(key, f"must be a list{size} of whole numbers > 0, got {seq!r}")
    return tuple(seq)


def _speaker_encoder(top: _Fields, talker_hidden: int) -> SpeakerEncoderConfig:
    """config.json ``speaker_encoder_config`` of a Base checkpoint (official defaults where it is silent)."""
    f = top.sub("speaker_encoder_config") if top.data.get("speaker_encoder_config") is not None else _Fields(
        top.path, {}, "speaker_encoder_config.")
    d = SPEAKER_ENCODER_DEFAULTS
    channels = _whole_list(f, "enc_channels", d["enc_channels"])
    if len(channels) < 3:
        raise f.fail("enc_channels", f"must list at least 3 layers (a TDNN, SE-Res2Net blocks, the aggregation), got {list(channels)}")
    cfg = SpeakerEncoderConfig(
        mel_dim=f.positive("mel_dim", d["mel_dim"]), dim=f.positive("enc_dim", d["enc_dim"]), channels=channels,
        kernels=_whole_list(f, "enc_kernel_sizes", d["enc_kernel_sizes"], len(channels)),
        dilations=_whole_list(f, "enc_dilations", d["enc_dilations"], len(channels)),
        attention_channels=f.positive("enc_attention_channels", d["enc_attention_channels"]),
        res2net_scale=f.positive("enc_res2net_scale", d["enc_res2net_scale"]),
        se_channels=f.positive("enc_se_channels", d["enc_se_channels"]),
        sample_rate=f.positive("sample_rate", d["sample_rate"]))
    if cfg.dim != talker_hidden:
        raise f.fail("enc_dim", f"is {cfg.dim}; the speaker embedding takes a talker position, so it must equal "
                                f"talker_config.hidden_size ({talker_hidden})")
    if cfg.sample_rate != 24000:
        raise f.fail("sample_rate", f"is {cfg.sample_rate}; the official speaker embedding is made at 24000 Hz only")
    if sum(channels[1:-1]) != channels[-1]:
        raise f.fail("enc_channels", f"must end with the sum of the SE-Res2Net blocks' channels ({sum(channels[1:-1])}), "
                                     f"got {channels[-1]}")
    if len(set(channels[:-1])) != 1:
        raise f.fail("enc_channels", f"must keep one width up to the aggregation (each SE-Res2Net block adds its "
                                     f"input back), got {list(channels)}")
    for c in channels[1:-1]:
        if c % cfg.res2net_scale:
            raise f.fail("enc_res2net_scale", f"must divide every SE-Res2Net block's channels, got {cfg.res2net_scale} "
                                              f"for {c}")
    return cfg


def _speech_encoder(path: Path) -> SpeechEncoderConfig:
    """speech_tokenizer/config.json ``encoder_config`` (a MimiConfig: its defaults where the file is silent)."""
    top = _Fields(path, read_json(path))
    f = top.sub("encoder_config")
    d = MIMI_DEFAULTS
    for key, want in (("use_causal_conv", True), ("pad_mode", "constant"), ("use_conv_shortcut", False),
                      ("hidden_act", "gelu"), ("audio_channels", 1)):
        got = f.get(key, type(want), d[key])
        if got != want:
            raise f.fail(key, f"is {got!r}; the 12 Hz encoder implemented here has {want!r}")
    heads = f.positive("num_attention_heads", d["num_attention_heads"])
    hidden = f.positive("hidden_size", d["hidden_size"])
    kv_heads = f.positive("num_key_value_heads", d["num_key_value_heads"])
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"must divide num_attention_heads ({heads}), got {kv_heads}")
    cfg = SpeechEncoderConfig(
        sample_rate=f.positive("sampling_rate", d["sampling_rate"]), filters=f.positive("num_filters", d["num_filters"]),
        ratios=_whole_list(f, "upsampling_ratios", d["upsampling_ratios"]),
        residual_layers=f.positive("num_residual_layers", d["num_residual_layers"]),
        kernel=f.positive("kernel_size", d["kernel_size"]), last_kernel=f.positive("last_kernel_size", d["last_kernel_size"]),
        residual_kernel=f.positive("residual_kernel_size", d["residual_kernel_size"]),
        dilation_growth=f.positive("dilation_growth_rate", d["dilation_growth_rate"]),
        compress=f.positive("compress", d["compress"]), hidden=hidden,
        layers=f.positive("num_hidden_layers", d["num_hidden_layers"]),
        intermediate=f.positive("intermediate_size", d["intermediate_size"]), heads=heads, kv_heads=kv_heads,
        head_dim=f.positive("head_dim", hidden // heads), rope_theta=f.get("rope_theta", float, d["rope_theta"]),
        norm_eps=f.get("norm_eps", float, d["norm_eps"]), codebook_size=f.positive("codebook_size", d["codebook_size"]),
        codebook_dim=f.positive("codebook_dim", d["codebook_dim"]),
        quantizers=f.positive("num_quantizers", d["num_quantizers"]),
        semantic_quantizers=f.positive("num_semantic_quantizers", d["num_semantic_quantizers"]),
        valid_quantizers=top.positive("encoder_valid_num_quantizers", 16),
        frame_rate=f.get("frame_rate", float, d["frame_rate"]))
    if f.positive("vector_quantization_hidden_dimension", d["vector_quantization_hidden_dimension"]) != cfg.codebook_dim:
        raise f.fail("vector_quantization_hidden_dimension", f"must equal codebook_dim ({cfg.codebook_dim})")
    if cfg.sample_rate != 24000:
        raise f.fail("sampling_rate", f"is {cfg.sample_rate}; the 12 Hz encoder takes 24000 Hz audio")
    if not cfg.semantic_quantizers < cfg.valid_quantizers <= cfg.quantizers:
        raise top.fail("encoder_valid_num_quantizers", f"must be in {cfg.semantic_quantizers + 1}.."
                                                       f"{cfg.quantizers}, got {cfg.valid_quantizers}")
    if cfg.hop * cfg.frame_rate >= cfg.sample_rate or cfg.downsample_kernel < 2:
        raise f.fail("frame_rate", f"is {cfg.frame_rate}; the encoder implemented here halves the SEANet's frame rate "
                                   f"({cfg.sample_rate / cfg.hop:g} Hz)")
    rate = top.positive("encode_downsample_rate", cfg.samples_per_frame)
    if rate != cfg.samples_per_frame:
        raise top.fail("encode_downsample_rate", f"is {rate}, but the encoder's strides make {cfg.samples_per_frame} "
                                                 "samples a frame")
    return cfg


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
    clones = model_type == "base"
    speech_config = root / "speech_tokenizer" / "config.json"
    return CheckpointConfig(
        path=root, model_type=model_type, size=spec.name, spec=spec, text=text, codec=codec, speakers=speakers,
        dialects=dialects, languages=languages, generation=_generation(root / "generation_config.json"),
        decoder=_decoder(speech_config), speaker_encoder=_speaker_encoder(top, talker.hidden) if clones else None,
        speech_encoder=_speech_encoder(speech_config) if clones else None, raw=raw,
    )
