"""Write a random-weight checkpoint in the official directory layout.

Why: no model hub is reachable here, and the speed of every stage depends on shapes, not on
values, so a checkpoint of the published shapes with random weights stands in for the real one
in benchmarks and in the documented quick start. Tests shrink the layer counts. The files are
the official ones -- ``config.json``, ``generation_config.json``, ``model.safetensors``, the text
tokenizer (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``), ``preprocessor_config.json``
and ``speech_tokenizer/`` (with the 12 Hz encoder and, in ``model.safetensors``, the speaker
encoder for a Base checkpoint) -- and the official ``qwen-tts`` loads them (a test does).

The text tokenizer is a byte-level BPE trained here on a few sentences (the real vocabulary is
not reachable either), padded to the real vocabulary's size so that the special tokens sit at
their published ids (151643 onwards). Random weights say nothing about voice quality.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from vllm_omni.tts.config import MIMI_DEFAULTS
from vllm_omni.tts.layout import decoder_shapes, speaker_encoder_shapes, speech_encoder_shapes, talker_shapes

SIZES = {  # talker shapes of the published checkpoints (reference sheet §1)
    "0.6B": {"size": "0b6", "hidden_size": 1024, "intermediate_size": 3072},
    "1.7B": {"size": "1b7", "hidden_size": 2048, "intermediate_size": 6144},
}
# Speakers, dialects and languages as the published CustomVoice config.json lists them.
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
             "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
             "sichuan_dialect": 2062}
# The Qwen3 added tokens (151643..151668) and the TTS ones after them, in id order.
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
FIRST_ADDED_ID = 151643
NOT_SPECIAL = range(14, 26)  # <tool_call> .. </think> are ordinary added tokens in Qwen3
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speech synthesis on a small computer, in real time.",
    "Hello, world! It's a test: numbers 12345, and contractions we'll, they're, I'm, don't.",
    "今天天气很好，我们去公园散步吧。语音合成需要把文字变成声音。",
    "Guten Tag! Bonjour à tous. ¿Qué tal? こんにちは、元気ですか。안녕하세요.",
)


def _stack(layers: int, hidden: int, intermediate: int, theta: float, **extra: Any) -> dict[str, Any]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": theta, "attention_bias": False, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True, "use_sliding_window": False, "sliding_window": None,
            **extra}


MODEL_TYPES = ("custom_voice", "voice_design", "base")


def checkpoint_configs(size: str = "0.6B", *, model_type: str = "custom_voice", talker_layers: int = 28,
                       predictor_layers: int = 5, decoder_layers: int = 8, text_hidden: int = 2048,
                       decoder_dim: int = 1536, encoder_layers: int = 8,
                       transformers_version: str = "4.57.3") -> dict[str, dict[str, Any]]:
    """The JSON files of a checkpoint, by relative path; the defaults are the published shapes.

    A Base checkpoint (``model_type="base"``) has no named speakers, and a speaker encoder (its
    config as published: the embedding's size and rate, the rest the official defaults) and the
    speech tokenizer's 12 Hz encoder (``encoder_layers`` transformer layers; the other fields are
    those of transformers' ``MimiConfig``, written out)."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid: {', '.join(SIZES)}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
    s = SIZES[size]
    predictor = _stack(predictor_layers, 1024, 3072, 1_000_000, vocab_size=2048, num_code_groups=16,
                       max_position_embeddings=65536, rope_scaling=None,
                       layer_types=["full_attention"] * predictor_layers, model_type="qwen3_tts_talker_code_predictor")
    talker = _stack(talker_layers, s["hidden_size"], s["intermediate_size"], 1_000_000,
                    vocab_size=3072, num_code_groups=16, max_position_embeddings=32768, model_type="qwen3_tts_talker",
                    rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                                  "type": "default"},
                    position_id_per_seconds=13, text_hidden_size=text_hidden, text_vocab_size=151936,
                    codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
                    codec_pad_id=2148, codec_think_bos_id=2156, codec_think_eos_id=2157,
                    codec_language_id=dict(LANGUAGES), code_predictor_config=predictor)
    if model_type == "custom_voice":
        talker["spk_id"] = dict(SPEAKERS)
        talker["spk_is_dialect"] = {k: DIALECTS.get(k, False) for k in SPEAKERS}
    else:
        talker["spk_id"], talker["spk_is_dialect"] = {}, {}
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "assistant_token_id": 77091,
        "im_end_token_id": 151645, "im_start_token_id": 151644, "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673, "tts_pad_token_id": 151671, "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": s["size"], "tts_model_type": model_type,
        "talker_config": talker, "transformers_version": transformers_version,
    }
    if model_type == "base":
        config["speaker_encoder_config"] = {"enc_dim": s["hidden_size"], "sample_rate": 24000}
    generation = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                  "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                  "subtalker_top_k": 50, "max_new_tokens": 8192}
    decoder = {"codebook_size": 2048, "codebook_dim": 512, "latent_dim": 1024, "hidden_size": 512,
               "intermediate_size": 1024, "head_dim": 64, "num_attention_heads": 16, "num_key_value_heads": 16,
               "num_hidden_layers": decoder_layers, "num_quantizers": 16, "num_semantic_quantizers": 1,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 72, "layer_scale_initial_scale": 0.01,
               "max_position_embeddings": 8000, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
               "decoder_dim": decoder_dim, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
               "semantic_codebook_size": 4096, "vector_quantization_hidden_dimension": 512}
    speech = {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
              "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
              "decode_upsample_rate": 1920, "encode_downsample_rate": 1920, "decoder_config": decoder,
              "encoder_config": {**{k: v for k, v in MIMI_DEFAULTS.items() if v is not None},
                                 "num_hidden_layers": encoder_layers, "_frame_rate": 12.5},
              "transformers_version": transformers_version}
    feature = {"feature_extractor_type": "EncodecFeatureExtractor",
               "feature_size": 1, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
               "sampling_rate": 24000, "chunk_length_s": None, "overlap": None}
    return {"config.json": config, "generation_config.json": generation, "speech_tokenizer/config.json": speech,
            "preprocessor_config.json": {"processor_class": "Qwen3TTSProcessor"},
            "speech_tokenizer/preprocessor_config.json": feature}


def write_tokenizer(root: Path, vocab_size: int = 1000) -> None:
    """A byte-level BPE trained on ``CORPUS``, padded so the added tokens sit at their published ids."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    from vllm_omni.tts.text import QWEN2_SPLIT

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(CORPUS) * 4, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    for i in range(len(vocab), FIRST_ADDED_ID):  # unreachable fillers: no merge produces them
        vocab[f"<|vo_fill_{i}|>"] = i
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (root / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {str(FIRST_ADDED_ID + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": i not in NOT_SPECIAL}
             for i, c in enumerate(ADDED_TOKENS)}
    config = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
              "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
              "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    (root / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")


def write_configs(root: Path, configs: dict[str, dict[str, Any]]) -> None:
    for rel, data in configs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def _write_tensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file

    from vllm_omni.tts.random_weights import init_tensor

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    tensors = {name: init_tensor(name, shape, seed).to(dt) for name, shape in shapes.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_random_checkpoint(out: str | Path, size: str = "0.6B", *, seed: int = 0, dtype: str = "bf16",
                            overwrite: bool = False, **shape: Any) -> Path:
    """Write a checkpoint of ``size`` (published shapes unless ``shape`` shrinks them) to ``out``.

    The directory appears whole or not at all: it is written next to ``out`` and renamed.
    """
    from vllm_omni.tts.config import load_config

    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be bf16 or fp32, got {dtype!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.part"  # removed below on failure, renamed on success
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_configs(tmp, checkpoint_configs(size, **shape))
        write_tokenizer(tmp)
        cfg = load_config(tmp)
        model, speech = talker_shapes(cfg), decoder_shapes(cfg.decoder)
        if cfg.clones:
            model.update(speaker_encoder_shapes(cfg.speaker_encoder))
            speech.update(speech_encoder_shapes(cfg.speech_encoder))
        _write_tensors(tmp / "model.safetensors", model, seed, dtype)
        _write_tensors(tmp / "speech_tokenizer" / "model.safetensors", speech, seed, dtype)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
