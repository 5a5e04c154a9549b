"""The tensors of an official checkpoint: every name the pipeline reads, with the shape its config implies.

One table per part serves three jobs: the loader checks a checkpoint against it before converting
anything (a wrong shape is named with its file and tensor), the random-checkpoint writer
writes exactly these tensors, and the tests' official-side writer fills the official classes'
parameters by the same names. The names are the official state-dict keys
(``model.safetensors`` and ``speech_tokenizer/model.safetensors``). No torch.
"""

from __future__ import annotations

from vllm_omni.models.spec import StackSpec
from vllm_omni.tts.config import CheckpointConfig, DecoderConfig, SpeakerEncoderConfig, SpeechEncoderConfig

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


def _conv1d(prefix: str, cin: int, cout: int, k: int, bias: bool = True) -> Shapes:
    out = {f"{prefix}.weight": (cout, cin, k)}
    if bias:
        out[f"{prefix}.bias"] = (cout,)
    return out


def speaker_encoder_shapes(sc: SpeakerEncoderConfig) -> Shapes:
    """``model.safetensors`` of a Base checkpoint: the ECAPA-TDNN speaker encoder (``speaker_encoder.*``)."""
    p, c = "speaker_encoder", sc.channels
    out = _conv1d(f"{p}.blocks.0.conv", sc.mel_dim, c[0], sc.kernels[0])
    for i in range(1, len(c) - 1):
        b, part = f"{p}.blocks.{i}", c[i] // sc.res2net_scale
        out.update(_conv1d(f"{b}.tdnn1.conv", c[i - 1], c[i], 1))
        for j in range(sc.res2net_scale - 1):
            out.update(_conv1d(f"{b}.res2net_block.blocks.{j}.conv", part, part, sc.kernels[i]))
        out.update(_conv1d(f"{b}.tdnn2.conv", c[i], c[i], 1))
        out.update(_conv1d(f"{b}.se_block.conv1", c[i], sc.se_channels, 1))
        out.update(_conv1d(f"{b}.se_block.conv2", sc.se_channels, c[i], 1))
    out.update(_conv1d(f"{p}.mfa.conv", c[-1], c[-1], sc.kernels[-1]))
    out.update(_conv1d(f"{p}.asp.tdnn.conv", 3 * c[-1], sc.attention_channels, 1))
    out.update(_conv1d(f"{p}.asp.conv", sc.attention_channels, c[-1], 1))
    out.update(_conv1d(f"{p}.fc", 2 * c[-1], sc.dim, 1))
    return out


def seanet_layers(ec: SpeechEncoderConfig) -> list[tuple[str, int]]:
    """The SEANet's modules in order, as (kind, index in ``encoder.encoder.layers``): "conv" (the first),
    "res" (a residual block), "down" (ELU then a strided conv), "last" (ELU then the last conv)."""
    out, i = [("conv", 0)], 1
    for _ in reversed(ec.ratios):
        for _ in range(ec.residual_layers):
            out.append(("res", i))
            i += 1
        out.append(("down", i + 1))  # the ELU takes index i
        i += 2
    out.append(("last", i + 1))
    return out


def speech_encoder_shapes(ec: SpeechEncoderConfig) -> Shapes:
    """``speech_tokenizer/model.safetensors`` of a Base checkpoint: the 12 Hz encoder (``encoder.*``)."""
    p = "encoder.encoder.layers"
    out: Shapes = {}
    scale = 1
    ratios = list(reversed(ec.ratios))
    down = 0
    for kind, i in seanet_layers(ec):
        c = scale * ec.filters
        if kind == "conv":
            out.update(_conv1d(f"{p}.{i}.conv", 1, ec.filters, ec.kernel))
        elif kind == "res":
            out.update(_conv1d(f"{p}.{i}.block.1.conv", c, c // ec.compress, ec.residual_kernel))
            out.update(_conv1d(f"{p}.{i}.block.3.conv", c // ec.compress, c, 1))
        elif kind == "down":
            out.update(_conv1d(f"{p}.{i}.conv", c, 2 * c, 2 * ratios[down]))
            down += 1
            scale *= 2
        else:
            out.update(_conv1d(f"{p}.{i}.conv", c, ec.hidden, ec.last_kernel))
    h, q, kv = ec.hidden, ec.heads * ec.head_dim, ec.kv_heads * ec.head_dim
    for i in range(ec.layers):
        t = f"encoder.encoder_transformer.layers.{i}"
        out.update({
            f"{t}.self_attn.q_proj.weight": (q, h), f"{t}.self_attn.k_proj.weight": (kv, h),
            f"{t}.self_attn.v_proj.weight": (kv, h), f"{t}.self_attn.o_proj.weight": (h, q),
            f"{t}.mlp.fc1.weight": (ec.intermediate, h), f"{t}.mlp.fc2.weight": (h, ec.intermediate),
            f"{t}.input_layernorm.weight": (h,), f"{t}.input_layernorm.bias": (h,),
            f"{t}.post_attention_layernorm.weight": (h,), f"{t}.post_attention_layernorm.bias": (h,),
            f"{t}.self_attn_layer_scale.scale": (h,), f"{t}.mlp_layer_scale.scale": (h,),
        })
    out.update(_conv1d("encoder.downsample.conv", h, h, ec.downsample_kernel, bias=False))
    for part, n in (("semantic", ec.semantic_quantizers), ("acoustic", ec.quantizers - ec.semantic_quantizers)):
        q = f"encoder.quantizer.{part}_residual_vector_quantizer"
        out.update(_conv1d(f"{q}.input_proj", h, ec.codebook_dim, 1, bias=False))
        out.update(_conv1d(f"{q}.output_proj", ec.codebook_dim, h, 1, bias=False))
        for j in range(n):
            cb = f"{q}.layers.{j}.codebook"
            out.update({f"{cb}.initialized": (1,), f"{cb}.cluster_usage": (ec.codebook_size,),
                        f"{cb}.embed_sum": (ec.codebook_size, ec.codebook_dim)})
    return out
