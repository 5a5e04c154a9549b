"""The tensors of an official checkpoint: every name the pipeline reads, with the shape its config implies.

One table serves three jobs: the loader checks a checkpoint against it before converting
anything (a wrong shape is named with its file and tensor), the random-checkpoint writer
writes exactly these tensors, and the tests' official-side writer fills the official classes'
parameters by the same names. The names are the official state-dict keys
(``model.safetensors`` and ``speech_tokenizer/model.safetensors``). No torch.
"""

from __future__ import annotations

from vllm_omni.models.spec import StackSpec
from vllm_omni.tts.config import CheckpointConfig, DecoderConfig

Shapes = dict[str, tuple[int, ...]]


def _block(prefix: str, s: StackSpec) -> Shapes:
    h = s.hidden
    return {
        f"{prefix}.input_layernorm.weight": (h,),
        f"{prefix}.post_attention_layernorm.weight": (h,),
        f"{prefix}.self_attn.q_proj.weight": (s.q_dim, h),
        f"{prefix}.self_attn.k_proj.weight": (s.kv_dim, h),
        f"{prefix}.self_attn.v_proj.weight": (s.kv_dim, h),
        f"{prefix}.self_attn.o_proj.weight": (h, s.q_dim),
        f"{prefix}.self_attn.q_norm.weight": (s.head_dim,),
        f"{prefix}.self_attn.k_norm.weight": (s.head_dim,),
        f"{prefix}.mlp.gate_proj.weight": (s.intermediate, h),
        f"{prefix}.mlp.up_proj.weight": (s.intermediate, h),
        f"{prefix}.mlp.down_proj.weight": (h, s.intermediate),
    }


def talker_shapes(cfg: CheckpointConfig) -> Shapes:
    """``model.safetensors``: the talker, its text embedding and projection, and the code predictor."""
    spec = cfg.spec
    t, p = spec.talker, spec.predictor
    out: Shapes = {
        "talker.model.text_embedding.weight": (spec.text_vocab, spec.text_hidden),
        "talker.model.codec_embedding.weight": (spec.codec_vocab, t.hidden),
        "talker.model.norm.weight": (t.hidden,),
        "talker.text_projection.linear_fc1.weight": (spec.text_hidden, spec.text_hidden),
        "talker.text_projection.linear_fc1.bias": (spec.text_hidden,),
        "talker.text_projection.linear_fc2.weight": (t.hidden, spec.text_hidden),
        "talker.text_projection.linear_fc2.bias": (t.hidden,),
        "talker.codec_head.weight": (spec.codec_vocab, t.hidden),
        "talker.code_predictor.model.norm.weight": (p.hidden,),
    }
    for i in range(t.layers):
        out.update(_block(f"talker.model.layers.{i}", t))
    for i in range(p.layers):
        out.update(_block(f"talker.code_predictor.model.layers.{i}", p))
    for g in range(spec.residual_codebooks):
        out[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (spec.codebook_size, t.hidden)
        out[f"talker.code_predictor.lm_head.{g}.weight"] = (spec.codebook_size, p.hidden)
    if spec.needs_projection:
        out["talker.code_predictor.small_to_mtp_projection.weight"] = (p.hidden, t.hidden)
        out["talker.code_predictor.small_to_mtp_projection.bias"] = (p.hidden,)
    return out


def _conv(prefix: str, cin: int, cout: int, k: int, groups: int = 1) -> Shapes:
    return {f"{prefix}.conv.weight": (cout, cin // groups, k), f"{prefix}.conv.bias": (cout,)}


def _tconv(prefix: str, cin: int, cout: int, k: int) -> Shapes:
    return {f"{prefix}.conv.weight": (cin, cout, k), f"{prefix}.conv.bias": (cout,)}


def _snake(prefix: str, c: int) -> Shapes:
    return {f"{prefix}.alpha": (c,), f"{prefix}.beta": (c,)}


def decoder_shapes(dc: DecoderConfig) -> Shapes:
    """``speech_tokenizer/model.safetensors``: the tensors of the decoder (the encoder is not read)."""
    s = dc.spec
    half, h = s.codebook_dim // 2, s.transformer_hidden
    out: Shapes = {}
    for part, n in (("rvq_first", 1), ("rvq_rest", s.quantizers - 1)):
        base = f"decoder.quantizer.{part}"
        out[f"{base}.output_proj.weight"] = (s.codebook_dim, half, 1)
        for i in range(n):
            out[f"{base}.vq.layers.{i}._codebook.embedding_sum"] = (s.codebook_size, half)
            out[f"{base}.vq.layers.{i}._codebook.cluster_usage"] = (s.codebook_size,)
    out.update(_conv("decoder.pre_conv", s.codebook_dim, s.latent_dim, 3))
    tr = "decoder.pre_transformer"
    out.update({f"{tr}.input_proj.weight": (h, s.latent_dim), f"{tr}.input_proj.bias": (h,),
                f"{tr}.output_proj.weight": (s.latent_dim, h), f"{tr}.output_proj.bias": (s.latent_dim,),
                f"{tr}.norm.weight": (h,)})
    q, kv = dc.heads * dc.head_dim, dc.kv_heads * dc.head_dim
    for i in range(s.transformer_layers):
        p = f"{tr}.layers.{i}"
        out.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (s.transformer_intermediate, h),
            f"{p}.mlp.up_proj.weight": (s.transformer_intermediate, h),
            f"{p}.mlp.down_proj.weight": (h, s.transformer_intermediate),
            f"{p}.self_attn_layer_scale.scale": (h,), f"{p}.mlp_layer_scale.scale": (h,),
        })
    c = s.latent_dim
    for i, factor in enumerate(s.upsampling_ratios):
        out.update(_tconv(f"decoder.upsample.{i}.0", c, c, factor))
        nx = f"decoder.upsample.{i}.1"
        out.update(_conv(f"{nx}.dwconv", c, c, 7, groups=c))
        out.update({f"{nx}.norm.weight": (c,), f"{nx}.norm.bias": (c,), f"{nx}.pwconv1.weight": (4 * c, c),
                    f"{nx}.pwconv1.bias": (4 * c,), f"{nx}.pwconv2.weight": (c, 4 * c), f"{nx}.pwconv2.bias": (c,),
                    f"{nx}.gamma": (c,)})
    out.update(_conv("decoder.decoder.0", s.latent_dim, s.decoder_dim, 7))
    for b, rate in enumerate(s.upsample_rates):
        cin, cout = s.decoder_dim // 2 ** b, s.decoder_dim // 2 ** (b + 1)
        p = f"decoder.decoder.{b + 1}.block"
        out.update(_snake(f"{p}.0", cin))
        out.update(_tconv(f"{p}.1", cin, cout, 2 * rate))
        for u in range(3):
            ru = f"{p}.{u + 2}"
            out.update(_snake(f"{ru}.act1", cout))
            out.update(_conv(f"{ru}.conv1", cout, cout, 7))
            out.update(_snake(f"{ru}.act2", cout))
            out.update(_conv(f"{ru}.conv2", cout, cout, 1))
    last = s.decoder_dim // 2 ** len(s.upsample_rates)
    n = len(s.upsample_rates) + 1
    out.update(_snake(f"decoder.decoder.{n}", last))
    out.update(_conv(f"decoder.decoder.{n + 1}", last, 1, 7))
    return out
