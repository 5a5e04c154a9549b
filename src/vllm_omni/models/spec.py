"""Shapes of the Qwen3-TTS 12 Hz models, as frozen dataclasses with every value explicit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StackSpec:
    """A stack of Qwen3 decoder blocks (q/k RMSNorm, RoPE, GQA, SwiGLU, no biases)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class ModelSpec:
    """One checkpoint size: the talker, its code predictor, and the codec vocabularies."""

    name: str
    talker: StackSpec
    predictor: StackSpec
    codec_vocab: int = 3072  # talker vocabulary (codebook 0 + specials)
    codebook_size: int = 2048  # per residual codebook
    num_code_groups: int = 16  # codebook 0 + 15 residual codebooks
    text_vocab: int = 151_936
    text_hidden: int = 2048
    eos_id: int = 2150
    frame_ms: float = 80.0  # 12.5 Hz

    @property
    def residual_codebooks(self) -> int:
        return self.num_code_groups - 1

    @property
    def needs_projection(self) -> bool:
        """1.7B projects talker-width embeddings to the predictor width (small_to_mtp_projection)."""
        return self.talker.hidden != self.predictor.hidden


_PREDICTOR = StackSpec(layers=5, hidden=1024, intermediate=3072)

MODELS: dict[str, ModelSpec] = {
    "0.6B": ModelSpec("Qwen3-TTS-12Hz-0.6B", StackSpec(layers=28, hidden=1024, intermediate=3072), _PREDICTOR),
    "1.7B": ModelSpec("Qwen3-TTS-12Hz-1.7B", StackSpec(layers=28, hidden=2048, intermediate=6144), _PREDICTOR),
}


def get_model(size: str) -> ModelSpec:
    try:
        return MODELS[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; valid: {', '.join(MODELS)}") from None


@dataclass(frozen=True)
class Code2WavSpec:
    """The 12 Hz tokenizer decoder (vocoder): 1920 samples at 24 kHz per frame."""

    latent_dim: int = 1024
    codebook_dim: int = 512
    codebook_size: int = 2048
    quantizers: int = 16
    transformer_hidden: int = 512
    transformer_intermediate: int = 1024
    transformer_layers: int = 8
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    sample_rate: int = 24_000
    parameters: int = 114_323_137  # counted by instantiating the official decoder (reference sheet §5)

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in self.upsample_rates + self.upsampling_ratios:
            n *= r
        return n


CODE2WAV = Code2WavSpec()
