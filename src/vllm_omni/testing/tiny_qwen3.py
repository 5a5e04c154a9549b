"""A tiny random-weight Qwen3 checkpoint, written offline, for running ``vllm.LLM`` in tests.

The folder holds what vLLM needs to load a Hugging Face model without any hub access:
``config.json``, ``generation_config.json``, ``tokenizer.json`` (a byte-level BPE built by
hand: the 256 byte symbols plus a few special tokens, no merges, no training) with its
``tokenizer_config.json``, and ``model.safetensors``.

The weights are random but *well conditioned* on purpose, so that a weight-only quantized
run can be compared token by token with the unquantized one:

- the token embedding has std 1.0 and the output head std ``head_std`` (0.3), so the logits
  have a spread of several units and the greedy choice is decided by clear margins;
- the decoder layers use small matrices (std ``layer_std``, 0.05): they do change the
  result (the output is not a function of the last token alone) but their rounding error
  under int8 stays well below the top-2 logit gap.

Usage::

    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3, tiny_qwen3
    path = build_tiny_qwen3("/tmp/tiny-qwen3")     # idempotent for the same arguments
    with tiny_qwen3() as path:                     # or in a temporary folder, removed on exit
        ...

Speed does not depend on weight values; this model exists for correctness checks, and its
timings describe vLLM's fixed overheads, not a real model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ARCHITECTURE = "Qwen3ForCausalLM"


@dataclass(frozen=True)
class TinyQwen3Config:
    """Shape and initialisation of the tiny model (defaults: 2 layers, hidden 128, fp32)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 320
    max_position_embeddings: int = 1024
    dtype: str = "float32"
    seed: int = 0
    embed_std: float = 1.0
    layer_std: float = 0.05
    head_std: float = 0.3

    def __post_init__(self) -> None:
        minimum = 256 + len(SPECIAL_TOKENS)
        if self.vocab_size < minimum:
            raise ValueError(f"vocab_size must be at least {minimum} (256 bytes + special tokens), got {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what the ByteLevel pre-tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokenizer_json(vocab_size: int) -> dict:
    """A byte-level BPE tokenizer with no merges: every byte is one token, then special tokens.

    Ids 0..255 are the bytes, then ``SPECIAL_TOKENS``, then ``<|extra_i|>`` fillers up to
    ``vocab_size`` so that every id the model can emit decodes to something.
    """
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    added = []
    names = list(SPECIAL_TOKENS) + [f"<|extra_{i}|>" for i in range(vocab_size - 256 - len(SPECIAL_TOKENS))]
    for i, name in enumerate(names):
        token_id = 256 + i
        vocab[name] = token_id
        added.append({"id": token_id, "content": name, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


def hf_config(cfg: TinyQwen3Config) -> dict:
    eos = 256  # <|endoftext|>
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": cfg.dtype,
        "initializer_range": cfg.layer_std,
    }


def state_dict(cfg: TinyQwen3Config) -> dict:
    """The checkpoint tensors under Hugging Face Qwen3 names, from one seeded generator."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)

    def normal(shape, std):
        return (torch.randn(*shape, generator=gen) * std).to(dtype).contiguous()

    def norm(n):
        return (1.0 + 0.05 * torch.randn(n, generator=gen)).to(dtype).contiguous()

    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_out, kv_out = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = {"model.embed_tokens.weight": normal((cfg.vocab_size, h), cfg.embed_std)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        out[p + "self_attn.q_proj.weight"] = normal((q_out, h), cfg.layer_std)
        out[p + "self_attn.k_proj.weight"] = normal((kv_out, h), cfg.layer_std)
        out[p + "self_attn.v_proj.weight"] = normal((kv_out, h), cfg.layer_std)
        out[p + "self_attn.o_proj.weight"] = normal((h, q_out), cfg.layer_std)
        out[p + "self_attn.q_norm.weight"] = norm(d)
        out[p + "self_attn.k_norm.weight"] = norm(d)
        out[p + "mlp.gate_proj.weight"] = normal((i, h), cfg.layer_std)
        out[p + "mlp.up_proj.weight"] = normal((i, h), cfg.layer_std)
        out[p + "mlp.down_proj.weight"] = normal((h, i), cfg.layer_std)
    out["model.norm.weight"] = norm(h)
    out["lm_head.weight"] = normal((cfg.vocab_size, h), cfg.head_std)
    return out


def build_tiny_qwen3(path: str | Path, config: TinyQwen3Config | None = None, **overrides) -> Path:
    """Write the tiny checkpoint into ``path`` (created if needed) and return it.

    Keyword ``overrides`` replace fields of :class:`TinyQwen3Config`. A folder that already
    holds a checkpoint of the same configuration is reused as it is; a folder holding
    anything else that is not ours is refused rather than overwritten.
    """
    cfg = config or TinyQwen3Config()
    if overrides:
        unknown = sorted(set(overrides) - set(TinyQwen3Config.__dataclass_fields__))
        if unknown:
            raise TypeError(f"unknown TinyQwen3Config field(s): {', '.join(unknown)}")
        cfg = TinyQwen3Config(**{**asdict(cfg), **overrides})
    path = Path(path)
    marker = path / "vllm_omni_tiny_qwen3.json"
    if marker.exists():
        try:
            if json.loads(marker.read_text()).get("fingerprint") == cfg.fingerprint():
                return path
        except (OSError, json.JSONDecodeError):
            pass
    elif path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists, is not empty and was not written by build_tiny_qwen3; choose another folder")
    path.mkdir(parents=True, exist_ok=True)

    from safetensors.torch import save_file

    (path / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": 256}, indent=2))
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json(cfg.vocab_size)))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": cfg.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    save_file(state_dict(cfg), str(path / "model.safetensors"), metadata={"format": "pt"})
    marker.write_text(json.dumps({"fingerprint": cfg.fingerprint(), "config": asdict(cfg)}, indent=2))
    return path


@contextlib.contextmanager
def tiny_qwen3(path: str | Path | None = None, **overrides) -> Iterator[Path]:
    """:func:`build_tiny_qwen3` into ``path``, or, when ``path`` is None, into a temporary
    folder that is removed on exit, so that a benchmark or example leaves nothing behind."""
    if path is not None:
        yield build_tiny_qwen3(path, **overrides)
        return
    with tempfile.TemporaryDirectory(prefix="vllm-omni-tiny-") as tmp:
        yield build_tiny_qwen3(Path(tmp) / "tiny-qwen3", **overrides)
