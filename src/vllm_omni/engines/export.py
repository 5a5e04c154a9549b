"""One code-predictor pass as a plain, exportable torch module with static shapes.

Why: every other engine (ONNX Runtime, OpenVINO, ExecuTorch, MNN, ncnn) starts from a graph
exported out of torch. ``PredictorPass`` is that graph for one single-token pass of the
0.6B code predictor at a fixed KV position: the same math as
``vllm_omni.cpu.reference`` (pre-norm RMSNorm, q/k RMSNorm over ``head_dim``, rotate-half
RoPE with theta 1e6, GQA 16 query / 8 KV heads, SwiGLU, final norm, one ``lm_head``),
written with ops every converter knows (``nn.Linear``, matmul, softmax, slice, cat) and no
data-dependent shapes.

Inputs: ``x`` [1, hidden], ``past_k`` and ``past_v`` [layers, kv_heads, position, head_dim]
(the cache of the ``position`` earlier tokens). Outputs: the logits of ``lm_head[head]``
[1, codebook_size], and the new token's ``k`` and ``v`` [layers, kv_heads, 1, head_dim]
(what an engine would append to its cache). RoPE's cos/sin for ``position`` are constants
of the graph, as a static-shape export per position would have them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import Tensor, nn

from vllm_omni.cpu.reference import rope_tables
from vllm_omni.cpu.weights import BlockWeights, PredictorWeights
from vllm_omni.models.spec import StackSpec

__all__ = ["INPUT_NAMES", "OUTPUT_NAMES", "PassBlock", "PredictorPass", "example_inputs", "export_onnx",
           "fingerprint", "reference_pass"]

INPUT_NAMES = ("x", "past_k", "past_v")
OUTPUT_NAMES = ("logits", "new_k", "new_v")


def _linear(w: Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class PassBlock(nn.Module):
    """One Qwen3 decoder layer for one token, attending over a fixed-length past."""

    def __init__(self, w: BlockWeights, stack: StackSpec):
        super().__init__()
        self.s = stack
        for name, m in w.matrices().items():
            setattr(self, name, _linear(m))
        for name in ("input_norm", "post_norm", "q_norm", "k_norm"):
            self.register_buffer(name, getattr(w, name).float().clone())

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor, cos: Tensor, sin: Tensor):
        """x [1, 1, H]; past_k/v [kv, P, d]; cos/sin [d]. Returns (x', k [kv, 1, d], v [kv, 1, d])."""
        s, eps = self.s, self.s.rms_eps
        group = s.heads // s.kv_heads
        h = _rms(x, self.input_norm, eps)
        q = _rms(self.q_proj(h).reshape(s.heads, s.head_dim), self.q_norm, eps)
        k = _rms(self.k_proj(h).reshape(s.kv_heads, s.head_dim), self.k_norm, eps)
        v = self.v_proj(h).reshape(s.kv_heads, 1, s.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = (k * cos + _rotate_half(k) * sin).reshape(s.kv_heads, 1, s.head_dim)
        keys = torch.cat((past_k, k), dim=1)  # [kv, P+1, d]
        values = torch.cat((past_v, v), dim=1)
        # query head j uses KV head j // group (HF repeat_kv): group them per KV head
        qg = q.reshape(s.kv_heads, group, s.head_dim)
        scores = torch.matmul(qg, keys.transpose(1, 2)) * (s.head_dim ** -0.5)  # [kv, group, P+1]
        a = torch.matmul(torch.softmax(scores, dim=-1), values)  # [kv, group, d]
        x = x + self.o_proj(a.reshape(1, 1, s.q_dim))
        h = _rms(x, self.post_norm, eps)
        x = x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
        return x, k, v


class PredictorPass(nn.Module):
    """The whole pass: ``layers`` blocks, final norm, ``lm_head[head]`` (see the module doc)."""

    def __init__(self, weights: PredictorWeights, position: int, head: int = 0):
        super().__init__()
        spec = weights.spec
        if spec.needs_projection:
            raise ValueError(f"{spec.name}: only the 0.6B predictor (no input projection) is exported")
        if position < 1:
            raise ValueError(f"position must be >= 1 (a past to attend over), got {position}")
        if not 0 <= head < spec.residual_codebooks:
            raise ValueError(f"head must be in 0..{spec.residual_codebooks - 1}, got {head}")
        self.s, self.position = spec.predictor, int(position)
        self.blocks = nn.ModuleList(PassBlock(w, spec.predictor) for w in weights.layers)
        self.register_buffer("norm", weights.norm.float().clone())
        self.lm_head = _linear(weights.lm_head[head])
        cos, sin = rope_tables(torch.tensor([position]), self.s.head_dim, self.s.rope_theta, torch.float32)
        self.register_buffer("cos", cos[0].clone())
        self.register_buffer("sin", sin[0].clone())

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor):
        x = x.reshape(1, 1, -1)  # 3-D activations: converters see MatMul, not Gemm, for every Linear
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past_k[i], past_v[i], self.cos, self.sin)
            ks.append(k)
            vs.append(v)
        logits = self.lm_head(_rms(x, self.norm, self.s.rms_eps)).reshape(1, -1)
        return logits, torch.stack(ks), torch.stack(vs)


def example_inputs(weights: PredictorWeights, position: int, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Deterministic (x [1, H], past_k, past_v) of the pass's shapes; K/V of unit scale, like normed keys."""
    s = weights.spec.predictor
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, s.hidden, generator=g) * 0.5
    shape = (len(weights.layers), s.kv_heads, position, s.head_dim)
    return x, torch.randn(shape, generator=g), torch.randn(shape, generator=g)


@torch.inference_mode()
def reference_pass(weights: PredictorWeights, x: Tensor, past_k: Tensor, past_v: Tensor, head: int = 0) -> Tensor:
    """Logits [1, vocab] of the eager reference (fp32) for the same pass: the oracle for exports."""
    from vllm_omni.cpu.reference import ReferencePredictor

    ref = ReferencePredictor(weights, "fp32")
    position = past_k.shape[2]
    for i, cache in enumerate(ref.stack.caches):
        cache.append(past_k[i].float(), past_v[i].float())
        assert cache.length == position
    return ref.heads[head](ref.stack.forward_last(x.float()))


def fingerprint(weights: PredictorWeights, position: int, head: int = 0) -> str:
    """A short id of the weights and shapes, so converted files under one workdir are reused safely."""
    h = hashlib.sha1()
    h.update(f"{weights.spec.name}|{len(weights.layers)}|{position}|{head}".encode())
    for t in (weights.norm, weights.lm_head[head, :4], weights.layers[0].q_proj[:4], weights.layers[-1].down_proj[:4]):
        h.update(t.float().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def export_onnx(weights: PredictorWeights, workdir: str | Path, position: int, head: int = 0) -> Path:
    """The pass as an fp32 ONNX file under ``workdir`` (exported once per weights and shapes).

    Uses torch's default (dynamo) exporter, which needs ``onnxscript``; weights are kept
    inside the file (no external data) so every converter can read it alone.
    """
    path = Path(workdir) / f"predictor-pass-{fingerprint(weights, position, head)}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    module = PredictorPass(weights, position, head).eval()
    args = example_inputs(weights, position)
    tmp = path.with_suffix(".tmp.onnx")
    import logging
    import warnings

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # optional-op registration chatter
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(tmp), input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES),
                          external_data=False, verbose=False)
    tmp.replace(path)
    return path
