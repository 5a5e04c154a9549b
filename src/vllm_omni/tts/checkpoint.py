"""Load an official Qwen3-TTS checkpoint directory: configs, tokenizer, and every weight checked.

Why the checks come first: a folder with a missing file, a tensor whose shape disagrees with its
config or an unknown model type is refused before any weight is converted, with the file and
the tensor or field named. The weights come out as the plain fp32 dataclasses the fused kernels
and the eager reference already take (``vllm_omni.cpu.weights``), so speech runs on the same
code the benchmarks measure, with one difference: the large matrices are read from the file
(and converted to fp32) when they are used, not at load, and are not kept. The fused kernels
read each once, to pack it, so a start holds one fp32 matrix at a time rather than all of them
(about 2.4 GB for 0.6B), and a start from packed weights already cached
(``vllm_omni.tts.weight_cache``) never reads them. The text embedding (151936 rows, 622 MB in
bf16) stays in the file too: a prompt reads only its own rows. A Base checkpoint's speaker
encoder and 12 Hz encoder are checked with the rest and read only when a voice is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.tts.config import CheckpointConfig, CheckpointError, load_config
from vllm_omni.tts.layout import decoder_shapes, speaker_encoder_shapes, speech_encoder_shapes, talker_shapes
from vllm_omni.tts.text import TextTokenizer, load_tokenizer

MODEL_FILE = "model.safetensors"
DECODER_FILE = "speech_tokenizer/model.safetensors"
FLOAT_DTYPES = ("F32", "BF16", "F16")


class _TensorFile:
    """One safetensors file whose tensors are checked against the shapes its config implies."""

    def __init__(self, path: Path, shapes: dict[str, tuple[int, ...]]):
        from safetensors import safe_open

        if not path.is_file():
            raise CheckpointError(f"{path}: missing (an official Qwen3-TTS checkpoint directory has it)")
        try:
            self.handle = safe_open(str(path), framework="pt")
        except Exception as exc:  # noqa: BLE001 - the library's parse error, with the file named
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
        self.path = path
        keys = set(self.handle.keys())
        missing = [n for n in shapes if n not in keys]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CheckpointError(f"{path}: tensor {missing[0]!r} is missing ({', '.join(missing[1:3]) or 'none else'}"
                                  f"{more} too); the configs imply {len(shapes)} tensors")
        for name, want in shapes.items():
            sl = self.handle.get_slice(name)
            got = tuple(sl.get_shape())
            if got != want:
                raise CheckpointError(f"{path}: tensor {name!r} has shape {list(got)}, but the configs imply "
                                      f"{list(want)} (check config.json / speech_tokenizer/config.json)")
            if sl.get_dtype() not in FLOAT_DTYPES:
                raise CheckpointError(f"{path}: tensor {name!r} has dtype {sl.get_dtype()}, expected one of {FLOAT_DTYPES}")

    def fp32(self, name: str):
        return self.handle.get_tensor(name).float()

    def rows(self, name: str, ids: list[int]):
        """Rows ``ids`` of a 2-D tensor, read one by one from the file (fp32)."""
        import torch

        sl = self.handle.get_slice(name)
        return torch.cat([sl[i:i + 1] for i in ids]).float() if ids else torch.empty(0, sl.get_shape()[1])


@dataclass
class TextWeights:
    """The text side of the prompt: embedding rows read on demand, then the two-layer projection."""

    file: _TensorFile
    fc1_w: Any
    fc1_b: Any
    fc2_w: Any
    fc2_b: Any

    def project(self, ids: list[int]):
        """``text_projection(text_embedding(ids))``: [len(ids), H_talker] fp32."""
        import torch.nn.functional as F

        x = self.file.rows("talker.model.text_embedding.weight", ids)
        return F.linear(F.silu(F.linear(x, self.fc1_w, self.fc1_b)), self.fc2_w, self.fc2_b)


@dataclass
class Checkpoint:
    """A loaded checkpoint: configs, tokenizer, talker, predictor, text projection and decoder weights."""

    config: CheckpointConfig
    tokenizer: TextTokenizer
    talker: Any  # shaped like vllm_omni.cpu.weights.TalkerWeights, large matrices read on use
    predictor: Any  # shaped like vllm_omni.cpu.weights.PredictorWeights, likewise
    text: TextWeights
    decoder: dict[str, Any]  # decoder.* tensors, fp32
    model_file: _TensorFile | None = None
    speech_file: _TensorFile | None = None

    @property
    def path(self) -> Path:
        return self.config.path

    def speaker_encoder_weights(self) -> dict[str, Any]:
        """A Base checkpoint's ``speaker_encoder.*`` tensors (fp32), read from the file when asked:
        only making a voice needs them, not speaking in one."""
        return self._read(self.model_file, speaker_encoder_shapes(self._base().speaker_encoder))

    def speech_encoder_weights(self) -> dict[str, Any]:
        """A Base checkpoint's ``encoder.*`` tensors (fp32) of the 12 Hz encoder, read when asked."""
        return self._read(self.speech_file, speech_encoder_shapes(self._base().speech_encoder))

    def _base(self) -> CheckpointConfig:
        if not self.config.clones:
            raise CheckpointError(f"{self.path}: {self.config.family} has no speaker encoder or 12 Hz encoder; "
                                  "voices are cloned with a Base checkpoint")
        return self.config

    @staticmethod
    def _read(file: _TensorFile, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        return {name: file.fp32(name) for name in shapes}


class _FromFile:
    """Attributes in ``names`` are read from ``file`` (fp32) each time they are used; others are plain."""

    def __init__(self, file: _TensorFile, names: dict[str, str], **plain: Any):
        self._file, self._names = file, names
        self.__dict__.update(plain)

    def __getattr__(self, attr: str):
        names = self.__dict__.get("_names", {})
        if attr not in names:
            raise AttributeError(f"{type(self).__name__} has no attribute {attr!r}")
        return self._file.fp32(names[attr])


class LazyBlock(_FromFile):
    """A ``BlockWeights`` whose seven matrices stay in the file until used; the norms are read at once."""

    def matrices(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self._names}


class LazyRows:
    """``t[i]`` is tensor ``names[i]`` read from the file (the predictor's 15 heads, one at a time)."""

    def __init__(self, file: _TensorFile, names: list[str]):
        self._file, self._names = file, names

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: int):
        return self._file.fp32(self._names[i])


def _block(f: _TensorFile, prefix: str) -> LazyBlock:
    a, m = f"{prefix}.self_attn", f"{prefix}.mlp"
    matrices = {"q_proj": f"{a}.q_proj.weight", "k_proj": f"{a}.k_proj.weight", "v_proj": f"{a}.v_proj.weight",
                "o_proj": f"{a}.o_proj.weight", "gate_proj": f"{m}.gate_proj.weight", "up_proj": f"{m}.up_proj.weight",
                "down_proj": f"{m}.down_proj.weight"}
    return LazyBlock(f, matrices, input_norm=f.fp32(f"{prefix}.input_layernorm.weight"),
                     post_norm=f.fp32(f"{prefix}.post_attention_layernorm.weight"),
                     q_norm=f.fp32(f"{a}.q_norm.weight"), k_norm=f.fp32(f"{a}.k_norm.weight"))


def load_checkpoint(model_dir: str | Path) -> Checkpoint:
    """Read and check ``model_dir``; CheckpointError (naming the file and the field) on any fault."""
    import torch

    cfg = load_config(model_dir)
    tokenizer = load_tokenizer(cfg)
    spec = cfg.spec
    model_shapes, speech_shapes = talker_shapes(cfg), decoder_shapes(cfg.decoder)
    if cfg.clones:  # checked now with the rest, read only when a voice is made
        model_shapes.update(speaker_encoder_shapes(cfg.speaker_encoder))
        speech_shapes.update(speech_encoder_shapes(cfg.speech_encoder))
    f = _TensorFile(cfg.path / MODEL_FILE, model_shapes)
    d = _TensorFile(cfg.path / DECODER_FILE, speech_shapes)
    talker = _FromFile(f, {"codec_head": "talker.codec_head.weight"}, spec=spec,
                       layers=[_block(f, f"talker.model.layers.{i}") for i in range(spec.talker.layers)],
                       norm=f.fp32("talker.model.norm.weight"),
                       codec_embedding=f.fp32("talker.model.codec_embedding.weight"))
    cp = "talker.code_predictor"
    groups = range(spec.residual_codebooks)
    lazy, plain = {}, {"proj_weight": None, "proj_bias": None}  # the projection is 1.7B's only
    if spec.needs_projection:
        lazy = {"proj_weight": f"{cp}.small_to_mtp_projection.weight"}
        plain = {"proj_bias": f.fp32(f"{cp}.small_to_mtp_projection.bias")}
    predictor = _FromFile(
        f, lazy, spec=spec, layers=[_block(f, f"{cp}.model.layers.{i}") for i in range(spec.predictor.layers)],
        norm=f.fp32(f"{cp}.model.norm.weight"),
        codec_embedding=torch.stack([f.fp32(f"{cp}.model.codec_embedding.{g}.weight") for g in groups]),
        lm_head=LazyRows(f, [f"{cp}.lm_head.{g}.weight" for g in groups]), **plain,
    )
    tp = "talker.text_projection"
    text = TextWeights(f, f.fp32(f"{tp}.linear_fc1.weight"), f.fp32(f"{tp}.linear_fc1.bias"),
                       f.fp32(f"{tp}.linear_fc2.weight"), f.fp32(f"{tp}.linear_fc2.bias"))
    decoder = {name: d.fp32(name) for name in decoder_shapes(cfg.decoder)}
    return Checkpoint(cfg, tokenizer, talker, predictor, text, decoder, f, d)
