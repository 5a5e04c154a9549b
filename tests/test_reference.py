"""The eager reference: one block against transformers' Qwen3DecoderLayer, shapes, and the
predictor's per-frame loop (cache lengths, positions, codes, embedding sum, sampling)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu import reference as ref  # noqa: E402
from vllm_omni.cpu.sampler import draw_uniforms  # noqa: E402
from vllm_omni.cpu.weights import random_block, random_predictor_weights, random_talker_weights  # noqa: E402
from vllm_omni.models.spec import get_model  # noqa: E402

# fp32 against fp32: both sides do the same maths in a different op order (SDPA vs eager
# softmax, fused vs separate matmuls), so differences are a few float32 ulps of O(1) values.
# 1e-4 absolute on outputs of magnitude ~1-3 leaves two orders of margin over what we see
# (~1e-6) while still catching any real mistake (a wrong RoPE, norm or GQA mapping moves
# outputs by 1e-2 or more).
HF_ATOL = 1e-4

P06, P17 = get_model("0.6B"), get_model("1.7B")


def _hf_layer(stack, w):
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        hidden_size=stack.hidden, intermediate_size=stack.intermediate, num_attention_heads=stack.heads,
        num_key_value_heads=stack.kv_heads, head_dim=stack.head_dim, rms_norm_eps=stack.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": stack.rope_theta}, num_hidden_layers=1,
        attention_bias=False, vocab_size=16,
    )
    cfg._attn_implementation = "eager"
    layer = qwen3.Qwen3DecoderLayer(cfg, 0).eval()
    sd = {
        "input_layernorm.weight": w.input_norm, "post_attention_layernorm.weight": w.post_norm,
        "self_attn.q_proj.weight": w.q_proj, "self_attn.k_proj.weight": w.k_proj,
        "self_attn.v_proj.weight": w.v_proj, "self_attn.o_proj.weight": w.o_proj,
        "self_attn.q_norm.weight": w.q_norm, "self_attn.k_norm.weight": w.k_norm,
        "mlp.gate_proj.weight": w.gate_proj, "mlp.up_proj.weight": w.up_proj, "mlp.down_proj.weight": w.down_proj,
    }
    layer.load_state_dict(sd, strict=True)
    return layer, qwen3.Qwen3RotaryEmbedding(cfg)


def test_block_matches_transformers_qwen3_layer():
    stack = P06.predictor
    w = random_block(stack, torch.Generator().manual_seed(3))
    layer, rotary = _hf_layer(stack, w)
    t = 6
    x = torch.randn(t, stack.hidden, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(t)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = layer(x[None], attention_mask=mask, position_ids=pos[None],
                     position_embeddings=rotary(x[None], pos[None]))[0]

    block = ref.ReferenceBlock(w, stack)
    # Prefill of the first 4 positions, then two single-token steps through the KV cache.
    cache = ref.KVCache(stack.kv_heads, stack.head_dim, torch.float32, capacity=2)
    got = []
    for lo, hi in ((0, 4), (4, 5), (5, 6)):
        cos, sin = ref.rope_tables(pos[lo:hi], stack.head_dim, stack.rope_theta, torch.float32)
        got.append(block.forward(x[lo:hi], cos, sin, cache))
    got = torch.cat(got)
    assert cache.length == t
    assert (got - want).abs().max().item() < HF_ATOL
    # and the comparison is not vacuous: the block changes its input
    assert (want - x).abs().max().item() > 1e-2


def test_talker_step_shapes_and_cache():
    w = random_talker_weights(P06, layers=1)
    talker = ref.ReferenceTalker(w, capacity=2)
    logits, hidden = talker.step(w.codec_embedding[2149])
    assert logits.shape == (3072,) and hidden.shape == (1024,)
    assert logits.dtype == hidden.dtype == torch.float32
    talker.step(hidden)
    talker.step(hidden)  # grows the cache past its initial capacity
    assert talker.position == 3
    talker.prefill(5)
    assert talker.position == 5
    talker.reset()
    assert talker.position == 0
    again, _ = talker.step(w.codec_embedding[2149])
    assert torch.equal(again, logits)


def test_logits_not_flat():
    """Greedy choices are decided by the weights, not by float rounding."""
    w = random_predictor_weights(P06, layers=1)
    pred = ref.ReferencePredictor(w)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(1, 1024, generator=g)
    logits = torch.stack([pred.heads[i](ref.rms_norm(h, w.norm, 1e-6))[0] for i in range(15)])
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert gaps.median().item() > 1e-2


@pytest.fixture(scope="module")
def pred06():
    return ref.ReferencePredictor(random_predictor_weights(P06, layers=1))


def _inputs(h, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(h, generator=g), torch.randn(h, generator=g) * 0.5


def test_predictor_frame_loop(pred06):
    past, c0 = _inputs(1024)
    codes, embed_sum = pred06.frame(past, c0)
    assert codes.shape == (15,) and codes.dtype == torch.int64
    assert ((codes >= 0) & (codes < 2048)).all()
    # pass 1 is a 2-token prefill at positions 0,1; pass k feeds one token at position k
    assert pred06.trace == [(0, 2, 2)] + [(k, 1, k + 1) for k in range(2, 16)]
    want = c0.clone()
    for k in range(1, 16):
        want += pred06.weights.codec_embedding[k - 1, codes[k - 1]]
    assert torch.allclose(embed_sum, want, atol=1e-5)
    # a fresh cache every frame: the same inputs give the same codes, positions restart at 0
    codes2, _ = pred06.frame(past, c0)
    assert torch.equal(codes, codes2)
    assert pred06.trace[0] == (0, 2, 2)


def test_predictor_first_code_is_lm_head0_on_prefill(pred06):
    """c1 = argmax(lm_head[0](norm(stack([past, c0]))[-1])), computed independently."""
    past, c0 = _inputs(1024, seed=5)
    codes, _ = pred06.frame(past, c0)
    stack = ref.ReferenceStack(pred06.weights.layers, pred06.weights.norm, P06.predictor, "fp32", 2)
    h = stack.forward_last(torch.stack([past, c0]))
    assert int(torch.argmax(h[0] @ pred06.weights.lm_head[0].T)) == int(codes[0])


def test_predictor_sampling_deterministic(pred06):
    past, c0 = _inputs(1024, seed=2)
    u = draw_uniforms(torch.Generator().manual_seed(7))
    a, _ = pred06.frame(past, c0, greedy=False, uniforms=u)
    b, _ = pred06.frame(past, c0, greedy=False, uniforms=u.clone())
    c, _ = pred06.frame(past, c0, greedy=False, seed=7)  # the same draw made internally
    assert torch.equal(a, b) and torch.equal(a, c)
    d, _ = pred06.frame(past, c0, greedy=False, uniforms=draw_uniforms(torch.Generator().manual_seed(8)))
    greedy, _ = pred06.frame(past, c0)
    assert not torch.equal(a, d)  # another draw changes the codes
    assert not torch.equal(a, greedy)  # and sampling is not argmax


def test_predictor_projection_1_7b():
    w = random_predictor_weights(P17, layers=1)
    assert w.proj_weight.shape == (1024, 2048) and w.proj_bias.shape == (1024,)
    assert w.codec_embedding.shape == (15, 2048, 2048)
    pred = ref.ReferencePredictor(w)
    past, c0 = _inputs(2048, seed=3)
    codes, embed_sum = pred.frame(past, c0)
    assert codes.shape == (15,) and embed_sum.shape == (2048,)
    # pass 1 sees the projected inputs
    stack = ref.ReferenceStack(w.layers, w.norm, P17.predictor, "fp32", 2)
    x = torch.stack([past, c0]) @ w.proj_weight.T + w.proj_bias
    h = stack.forward_last(x)
    assert int(torch.argmax(h[0] @ w.lm_head[0].T)) == int(codes[0])


def test_shallow_stack_is_prefix_of_full_seed():
    a = random_talker_weights(P06, seed=4, layers=1)
    b = random_talker_weights(P06, seed=4, layers=2)
    assert torch.equal(a.layers[0].q_proj, b.layers[0].q_proj)
    assert torch.equal(a.codec_head, b.codec_head)
    c = random_talker_weights(P06, seed=5, layers=1)
    assert not torch.equal(a.layers[0].q_proj, c.layers[0].q_proj)


# Relative error (Frobenius) of each format's linear against fp32, on Gaussian weights and inputs.
# What the format gives, and what seeds 0-5 showed:
# - bf16: 8 significant bits on weights, inputs and output, about 2^-9 per rounding: 0.27-0.31 %.
# - int8 (torch's dynamic quantization): one scale for the whole weight (the largest of 131k
#   Gaussian values, about 4.5 sigma, over 127 steps: about 1 % rms) and 7-bit per-tensor
#   activations (about 2 %): 1.9-2.2 %.
# - int4: 16 levels per group of 32 weights (the group's range, about 4 sigma, over 15 steps:
#   about 8 % rms) with bf16 inputs: 7.9-8.7 %.
# The upper bound leaves about 2.5-3x over the largest seen; the lower one, about a fifth of the
# smallest, fails if a format's rounding is not in effect (its weights kept in fp32).
@pytest.mark.parametrize("fmt,lo,hi", [("bf16", 5e-4, 0.01), ("int8", 4e-3, 0.05), ("int4", 0.015, 0.2)])
def test_quantized_linear_close_to_fp32(fmt, lo, hi):
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)) * 0.02
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    want = x @ w.T
    got = ref.make_linear(w, fmt)(x.to(ref.act_dtype(fmt))).float()
    rel = (got - want).norm() / want.norm()
    assert lo < rel.item() < hi
