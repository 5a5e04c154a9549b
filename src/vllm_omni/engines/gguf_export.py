"""This project's random Qwen3-TTS weights written as GGUF files that llama.cpp loads as ``qwen3``.

Why: a llama.cpp baseline is only a baseline if llama.cpp runs the very numbers our kernels
run. The code predictor and the talker are plain Qwen3 decoder stacks (pre-norm RMSNorm, q/k
RMSNorm over ``head_dim``, NEOX-style RoPE with theta 1e6, GQA, SwiGLU, no biases), so they
map onto llama.cpp's ``qwen3`` architecture tensor for tensor:

- ``token_embd``: a codec embedding table, so that token id ``i`` feeds row ``i`` (the
  predictor's table ``head``; for 1.7B projected to the predictor width through
  ``small_to_mtp_projection``, which is linear, so the projected table is exact); always F32,
  since a single-token pass reads one row of it;
- ``blk.N.*``: the decoder layers, matrices in the nn.Linear layout ``[out, in]`` as GGUF
  stores them (no q/k permutation: llama.cpp's ``qwen3`` rotates halves like HF);
- ``output_norm`` / ``output``: the final norm and one head (the predictor's ``lm_head[head]``
  or the talker's ``codec_head``).

Matrices, the head included, are written in the chosen format (``GGUF_TYPES``); 1-D norms
stay F32 as llama.cpp requires. llama.cpp also needs a tokenizer: a minimal SentencePiece-style
vocabulary (``<unk> <s> </s>``, 256 byte tokens, filler pieces) with exactly as many entries
as the embedding has rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# our format name -> GGUF tensor type name (gguf.GGMLQuantizationType member)
GGUF_TYPES = {"fp32": "F32", "fp16": "F16", "int8": "Q8_0", "int4": "Q4_0"}
# GGUF tensor type name -> general.file_type (gguf.LlamaFileType member)
_FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0"}
CONTEXT_LENGTH = 32_768
_SPECIALS = ("<unk>", "<s>", "</s>")


def gguf_type(fmt: str) -> str:
    """The GGUF tensor type of one of our format names; ValueError naming the valid ones."""
    try:
        return GGUF_TYPES[fmt]
    except KeyError:
        raise ValueError(f"no GGUF type for format {fmt!r}; valid: {', '.join(GGUF_TYPES)}") from None


@dataclass(frozen=True)
class GGUFFile:
    """One written file: where, what it holds, and the bytes of each tensor as stored."""

    path: Path
    fmt: str
    gguf_type: str
    vocab: int
    layers: int
    tensor_bytes: dict[str, int] = field(repr=False)

    @property
    def token_bytes(self) -> int:
        """Bytes one single-token decode reads from the weights: every tensor once, except the
        embedding table, of which it reads one row."""
        emb = self.tensor_bytes["token_embd.weight"]
        return sum(self.tensor_bytes.values()) - emb + emb // self.vocab


def minimal_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of an ``n``-entry SentencePiece-style vocabulary."""
    import gguf

    base = len(_SPECIALS) + 256
    if n < base:
        raise ValueError(f"a vocabulary needs at least {base} entries (specials + 256 bytes), got {n}")
    tt = gguf.TokenType
    tokens = list(_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * 256
    tokens += [f"\u2581c{i}" for i in range(n - base)]
    types += [tt.NORMAL] * (n - base)
    scores = [0.0] * base + [-float(i) for i in range(n - base)]
    return tokens, scores, [int(t) for t in types]


def _array(t: Any, qtype: Any) -> Any:
    """A torch/numpy fp32 tensor as the numpy array GGUFWriter stores for ``qtype``."""
    import gguf
    import numpy as np

    a = np.ascontiguousarray(t.detach().float().numpy() if hasattr(t, "detach") else t, dtype=np.float32)
    return gguf.quants.quantize(a, qtype)


def write_stack(path: str | Path, *, fmt: str, stack: Any, layers: list[Any], norm: Any, embedding: Any,
                head: Any, name: str) -> GGUFFile:
    """Write a decoder stack (``vllm_omni.cpu.weights.BlockWeights`` list) with an embedding
    ``[V, hidden]`` and a head ``[V, hidden]`` as a ``qwen3`` GGUF file."""
    import gguf

    qname = gguf_type(fmt)
    qtype = gguf.GGMLQuantizationType[qname]
    f32 = gguf.GGMLQuantizationType.F32
    vocab, hidden = int(embedding.shape[0]), int(embedding.shape[1])
    if hidden != stack.hidden or tuple(head.shape) != (vocab, hidden):
        raise ValueError(f"embedding {tuple(embedding.shape)} and head {tuple(head.shape)} must both be "
                         f"[vocab, {stack.hidden}]")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name(name)
    w.add_block_count(len(layers))
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(stack.intermediate)
    w.add_head_count(stack.heads)
    w.add_head_count_kv(stack.kv_heads)
    w.add_key_length(stack.head_dim)
    w.add_value_length(stack.head_dim)
    w.add_rope_freq_base(float(stack.rope_theta))
    w.add_layer_norm_rms_eps(float(stack.rms_eps))
    w.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[qname]]))
    tokens, scores, types = minimal_vocab(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    sizes: dict[str, int] = {}

    def put(tname: str, t: Any, q: Any) -> None:
        a = _array(t, q)
        sizes[tname] = int(a.nbytes)
        w.add_tensor(tname, a, raw_dtype=q)

    put("token_embd.weight", embedding, f32)
    for i, b in enumerate(layers):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", b.input_norm, f32)
        put(p + "attn_q.weight", b.q_proj, qtype)
        put(p + "attn_k.weight", b.k_proj, qtype)
        put(p + "attn_v.weight", b.v_proj, qtype)
        put(p + "attn_q_norm.weight", b.q_norm, f32)
        put(p + "attn_k_norm.weight", b.k_norm, f32)
        put(p + "attn_output.weight", b.o_proj, qtype)
        put(p + "ffn_norm.weight", b.post_norm, f32)
        put(p + "ffn_gate.weight", b.gate_proj, qtype)
        put(p + "ffn_up.weight", b.up_proj, qtype)
        put(p + "ffn_down.weight", b.down_proj, qtype)
    put("output_norm.weight", norm, f32)
    put("output.weight", head, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path, fmt, qname, vocab, len(layers), sizes)


def predictor_embedding(weights: Any, head: int = 0) -> Any:
    """The predictor's codec table ``head`` at the predictor's width (projected for 1.7B), fp32."""
    import torch

    table = weights.codec_embedding[head].float()
    if weights.proj_weight is None:
        return table
    with torch.no_grad():
        return table @ weights.proj_weight.float().T + weights.proj_bias.float()


def export_predictor(weights: Any, path: str | Path, fmt: str, *, head: int = 0) -> GGUFFile:
    """The code predictor (``PredictorWeights``) with ``lm_head[head]`` as its one output head."""
    groups = weights.lm_head.shape[0]
    if not 0 <= head < groups:
        raise ValueError(f"head must be in 0..{groups - 1}, got {head}")
    return write_stack(path, fmt=fmt, stack=weights.spec.predictor, layers=weights.layers, norm=weights.norm,
                       embedding=predictor_embedding(weights, head), head=weights.lm_head[head],
                       name=f"{weights.spec.name} code predictor (random weights)")


def export_talker(weights: Any, path: str | Path, fmt: str) -> GGUFFile:
    """The talker (``TalkerWeights``): its stack, codec embedding and codec head."""
    return write_stack(path, fmt=fmt, stack=weights.spec.talker, layers=weights.layers, norm=weights.norm,
                       embedding=weights.codec_embedding, head=weights.codec_head,
                       name=f"{weights.spec.name} talker (random weights)")
