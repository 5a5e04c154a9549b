"""Speech end to end on a small random-weight checkpoint in the official layout (our writer).

What is checked here: the loader's refusals (each naming the file and the field), the prompt's
refusals, the tokenizer's special ids and pre-tokenizer rule, the decoder's streaming state
(frame by frame and in uneven chunks equal to one whole decode), reproducible sampling, the
pipeline's audio length, and the command's WAV (complete, or absent after a failure). The
comparison with the official implementation is tests/test_tts_official.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.tts import cli
from vllm_omni.tts.checkpoint import load_checkpoint
from vllm_omni.tts.config import CheckpointError, load_config
from vllm_omni.tts.decoder import StreamingDecoder
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.prompt import PromptError, build_prompt
from vllm_omni.tts.random_checkpoint import ADDED_TOKENS, FIRST_ADDED_ID, write_random_checkpoint
from vllm_omni.tts.text import uses_fixed_split
from vllm_omni.tts.wav import WavWriter, read_wav

SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("tts") / "tiny", "0.6B", dtype="fp32", **SHAPE)


@pytest.fixture(scope="session")
def speech(tiny_dir) -> Speech:
    return Speech.load(tiny_dir, weights="fp32", threads=2, max_positions=256)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# --- the checkpoint ---------------------------------------------------------------------------

def test_config_reads_every_shape_from_the_files(tiny_dir):
    cfg = load_config(tiny_dir)
    assert cfg.family == "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    assert (cfg.spec.talker.layers, cfg.spec.talker.hidden, cfg.spec.predictor.layers) == (2, 1024, 1)
    assert cfg.spec.text_hidden == 256 and cfg.decoder.spec.decoder_dim == 384
    assert cfg.decoder.spec.samples_per_frame == 1920 and cfg.decoder.sliding_window == 72
    assert "ryan" in cfg.speakers and "beijing_dialect" not in cfg.supported_languages


@pytest.mark.parametrize("missing", ["config.json", "generation_config.json", "speech_tokenizer/config.json",
                                     "model.safetensors", "speech_tokenizer/model.safetensors", "vocab.json"])
def test_a_missing_file_is_named(tiny_dir, tmp_path, missing):
    d = _copy(tiny_dir, tmp_path / "ck")
    (d / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")):
        load_checkpoint(d)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.update(model_type="llama"), "model_type"),
    (lambda c: c.update(tts_model_type="podcast"), "tts_model_type"),
    (lambda c: c["talker_config"].update(num_key_value_heads=3), "talker_config.num_key_value_heads"),
    (lambda c: c["talker_config"].pop("codec_eos_token_id"), "talker_config.codec_eos_token_id"),
    (lambda c: c["talker_config"]["spk_is_dialect"].pop("ryan"), "talker_config.spk_is_dialect"),
    (lambda c: c["talker_config"]["code_predictor_config"].update(hidden_size="big"),
     "talker_config.code_predictor_config.hidden_size"),
])
def test_a_bad_config_field_is_named(tiny_dir, tmp_path, edit, field):
    d = _copy(tiny_dir, tmp_path / "ck")
    _edit_json(d / "config.json", edit)
    with pytest.raises(CheckpointError, match=f"config.json: field '{field}'"):
        load_config(d)


def test_a_base_config_without_the_speaker_encoder_names_the_tensor(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "ck")
    _edit_json(d / "config.json", lambda c: c.update(tts_model_type="base", speaker_encoder_config={"enc_dim": 1024}))
    assert load_config(d).clones
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'speaker_encoder\..*' is missing"):
        load_checkpoint(d)


def test_a_shape_that_disagrees_with_its_config_is_named(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path / "ck")
    _edit_json(d / "config.json", lambda c: c["talker_config"].update(intermediate_size=2048))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'talker\.model\.layers\.0\.mlp\.gate_proj"
                                              r"\.weight' has shape \[3072, 1024\], but the configs imply \[2048, 1024\]"):
        load_checkpoint(d)


def test_a_missing_tensor_is_named(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_dir, tmp_path / "ck")
    tensors = load_file(d / "speech_tokenizer" / "model.safetensors")
    del tensors["decoder.pre_conv.conv.bias"]
    save_file(tensors, d / "speech_tokenizer" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"tensor 'decoder\.pre_conv\.conv\.bias' is missing"):
        load_checkpoint(d)


# --- the tokenizer and the prompt -------------------------------------------------------------

def test_special_tokens_sit_at_their_published_ids(speech):
    tok = speech.ckpt.tokenizer
    for i, content in enumerate(ADDED_TOKENS):
        assert tok.backend.token_to_id(content) == FIRST_ADDED_ID + i
    ids = tok.encode("<|im_start|>assistant\nhi<|im_end|>")
    assert ids[0] == 151644 and ids[-1] == 151645
    assert tok.decode(ids) == "<|im_start|>assistant\nhi<|im_end|>"


@pytest.mark.parametrize("version, fixed", [("4.57.3", True), ("4.57.2", False), ("4.50.0", False),
                                            ("5.0.0", False), (None, True)])
def test_the_official_pre_tokenizer_rule(version, fixed):
    assert uses_fixed_split({} if version is None else {"transformers_version": version}) is fixed


def test_prompt_layout_streaming_and_not(speech):
    ck = speech.ckpt
    body = len(ck.tokenizer.encode("<|im_start|>assistant\nHello there.<|im_end|>\n<|im_start|>assistant\n")) - 8
    p = build_prompt(ck, "Hello there.", speaker="ryan", language="english")
    # role 3 + (think, think_bos, lang, think_eos, speaker, pad) + first text token with bos
    assert p.prefill.shape == (3 + 6 + 1, 1024) and p.trailing.shape[0] == body - 1 + 1
    q = build_prompt(ck, "Hello there.", speaker="ryan", language="english", streaming_text=False)
    assert q.prefill.shape[0] == 3 + 6 + body + 1 + 1 and q.trailing.shape[0] == 1
    assert torch.equal(q.text_term(0), q.text_term(5))
    assert build_prompt(ck, "x", speaker="ryan", language="auto").language_id is None
    assert build_prompt(ck, "你好", speaker="eric", language="chinese").language_id == 2062  # a dialect speaker


@pytest.mark.parametrize("kw, match", [
    (dict(text="", speaker="ryan"), "text is empty"),
    (dict(text="  \n", speaker="ryan"), "text is empty"),
    (dict(text="hi", speaker="nobody"), "unknown speaker 'nobody'; valid: aiden, dylan"),
    (dict(text="hi"), "speaker is required"),
    (dict(text="hi", speaker="ryan", language="klingon"), "unknown language 'klingon'; valid: auto, chinese"),
    (dict(text="hi " * 50, speaker="ryan", max_text_tokens=10), "the maximum is 10"),
])
def test_bad_requests_are_refused_naming_the_parameter(speech, kw, match):
    with pytest.raises(PromptError, match=match):
        build_prompt(speech.ckpt, **kw)


# --- the decoder ------------------------------------------------------------------------------

def test_streaming_decode_equals_whole_decode(speech):
    dec = StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder)
    codes = torch.randint(0, 2048, (90, 16), generator=torch.Generator().manual_seed(1))
    whole = dec.decode(codes)
    assert whole.shape == (90 * 1920,)
    assert 0.01 < float(whole.std()) and float((whole.abs() >= 1).float().mean()) < 0.01  # audio, not clipping
    dec.reset()
    frames = torch.cat([dec.push(codes[i:i + 1]) for i in range(90)])
    dec.reset()
    cuts = [0, 1, 4, 11, 12, 40, 77, 90]  # uneven chunks, across the 72-frame window
    chunks = torch.cat([dec.push(codes[a:b]) for a, b in zip(cuts, cuts[1:])])
    assert float((frames - whole).abs().max()) < 1e-4
    assert float((chunks - whole).abs().max()) < 1e-4
    dec.reset()  # a new utterance starts from zero state
    assert torch.equal(dec.push(codes[:3]), dec.decode(codes[:3]))


def test_the_decoder_counts_its_multiply_adds_and_times_its_stages(speech, monkeypatch):
    """``stages`` (what decoder-split's rates divide by) agrees with PyTorch's own count of the
    products the decode runs, and ``push(times=...)`` times every stage without changing the audio."""
    from torch.utils.flop_counter import FlopCounterMode

    import vllm_omni.tts.decoder as decoder_module

    monkeypatch.setattr(decoder_module, "_native", lambda: None)  # every product a PyTorch op, counted
    dec = StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder)
    codes = torch.randint(0, 2048, (8, 16), generator=torch.Generator().manual_seed(2))
    dec.push(codes[:4])  # past the start, where the convs' tails are zeros
    with FlopCounterMode(display=False) as count:
        dec.push(codes[4:])
    stages = dict(dec.stages())
    counted = count.get_total_flops() / 2 / 4  # multiply-adds per frame
    attention = counted - sum(stages.values())
    assert 0 <= attention < 0.2 * stages["transformer"], (counted, stages)
    dec.reset()
    plain = dec.push(codes)
    dec.reset()
    times: dict[str, float] = {}
    timed = torch.cat([dec.push(codes[:3], times), dec.push(codes[3:], times)])
    assert list(times) == list(stages) and all(t > 0 for t in times.values())
    assert float((timed - plain).abs().max()) < 1e-4


def test_the_bf16_decoder_streams_close_to_the_fp32_decode(speech):
    """bf16 long convolutions (the default with int8/int4 weights where the CPU multiplies bf16):
    streamed in uneven chunks, within a stated distance of the fp32 whole decode."""
    from vllm_omni.tts.pipeline import decoder_precision

    dc = speech.ckpt.config.decoder
    codes = torch.randint(0, 2048, (40, 16), generator=torch.Generator().manual_seed(3))
    ref = StreamingDecoder(speech.ckpt.decoder, dc).decode(codes)
    dec = StreamingDecoder(speech.ckpt.decoder, dc, "bf16")
    assert dec.conv_in.w16 is not None and dec.conv_out.w16 is None  # the last conv stays fp32
    cuts = [0, 1, 2, 4, 6, 10, 14, 40]
    got = torch.cat([dec.push(codes[a:b]) for a, b in zip(cuts, cuts[1:])])
    snr = 10 * torch.log10(ref.pow(2).mean() / (got - ref).pow(2).mean())
    assert got.shape == ref.shape and 30 < float(snr) < 80  # close, and not secretly fp32
    with pytest.raises(ValueError, match="decoder precision must be one of fp32, bf16, int8"):
        StreamingDecoder(speech.ckpt.decoder, dc, "fp16")
    assert decoder_precision("auto", "fp32") == "fp32" and decoder_precision("bf16", "fp32") == "bf16"
    with pytest.raises(ValueError, match="decoder must be one of auto, fp32, bf16, int8, got 'int4'"):
        decoder_precision("int4", "int4")


def test_auto_picks_bf16_then_int8_then_fp32_by_what_the_cpu_multiplies(monkeypatch):
    """With quantized weights "auto" is bf16 where the CPU multiplies bf16 natively, else int8 where it
    multiplies int8 in SIMD, else fp32; fp32 weights keep fp32 everywhere. The command takes each."""
    from vllm_omni.tts import cli, decoder, pipeline

    for bf16, int8, want in [(True, True, "bf16"), (False, True, "int8"), (False, False, "fp32")]:
        monkeypatch.setattr(decoder, "bf16_helps", lambda v=bf16: v)
        monkeypatch.setattr(decoder, "int8_helps", lambda v=int8: v)
        assert pipeline.decoder_precision("auto", "int4") == want
        assert pipeline.decoder_precision("auto", "fp32") == "fp32"
    assert cli.DECODER_CHOICES == pipeline.DECODER_CHOICES


def test_the_int8_decoder_is_refused_where_its_loop_would_be_plain_c(speech, monkeypatch):
    from vllm_omni.cpu import conv

    from vllm_omni.tts.pipeline import decoder_precision

    monkeypatch.setattr(conv, "int8_available", lambda variant="native": False)
    with pytest.raises(ValueError, match="the int8 decoder needs a CPU that multiplies int8 in SIMD .AVX-512 VNNI"):
        StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder, "int8")
    with pytest.raises(ValueError, match="the int8 decoder needs"):  # the command says so before reading weights
        decoder_precision("int8", "int4")


def test_decoder_refuses_bad_codes(speech):
    dec = StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder)
    with pytest.raises(ValueError, match=r"codes must be \[frames, 16\]"):
        dec.push(torch.zeros(3, 15, dtype=torch.int64))
    with pytest.raises(ValueError, match="below 2048"):
        dec.push(torch.full((1, 16), 2048))


# --- generation and the pipeline --------------------------------------------------------------

def test_pipeline_streams_chunks_of_whole_frames(speech):
    chunks = list(speech.stream("A short test sentence.", speaker="ryan", language="english", greedy=True,
                                max_frames=9, chunk_frames=4))
    st = speech.last_stats
    total = sum(c.frames for c in chunks)
    assert total == st.frames and 1 <= total <= 9
    assert [c.frames for c in chunks][: min(4, len(chunks) - 1)] == [1, 1, 2, 2][: min(4, len(chunks) - 1)]
    assert all(c.frames <= 4 for c in chunks)
    assert all(c.samples.shape == (c.frames * 1920,) for c in chunks)
    assert st.first_audio_s == chunks[0].ready_s and st.first_audio_s <= st.total_s
    assert len(st.generation.frames) == total and len(st.decoder_ms) == total


def test_chunks_grow_from_one_frame():
    from itertools import islice

    from vllm_omni.tts.pipeline import chunk_schedule

    assert list(islice(chunk_schedule(4), 7)) == [1, 1, 2, 2, 4, 4, 4]
    assert list(islice(chunk_schedule(1), 5)) == [1, 1, 1, 1, 1]


def test_greedy_is_deterministic_and_seeds_reproduce(speech):
    kw = dict(speaker="vivian", language="chinese", max_frames=12)
    a = speech.synthesize("今天天气很好。", greedy=True, **kw)
    b = speech.synthesize("今天天气很好。", greedy=True, **kw)
    assert np.array_equal(a, b)
    s1 = speech.synthesize("今天天气很好。", seed=7, **kw)
    s2 = speech.synthesize("今天天气很好。", seed=7, **kw)
    s3 = speech.synthesize("今天天气很好。", seed=8, **kw)
    assert np.array_equal(s1, s2) and not (s1.shape == s3.shape and np.array_equal(s1, s3))


def test_generation_stops_at_eos_and_drops_its_frame(speech, monkeypatch):
    gen = speech.generator
    real_rows = gen.talker.native.forward_rows
    calls = []

    def eos_after_three(x, positions, caches, head=None, head_rows=None):
        out, logits = real_rows(x, positions, caches, head=head, head_rows=head_rows)
        calls.append(1)
        if len(calls) >= 4:  # the prompt's call, then the steps after frames 0 and 1, then EOS after frame 2
            logits = torch.full_like(logits, -10.0)
            logits[:, 2150] = 10.0
        return out, logits

    monkeypatch.setattr(gen.talker.native, "forward_rows", eos_after_three)
    p = build_prompt(speech.ckpt, "hello", speaker="ryan")
    from vllm_omni.tts.generate import GenerationStats, Sampling

    stats = GenerationStats()
    frames = list(gen.generate(p, Sampling(greedy=True), max_frames=50, stats=stats))
    assert len(frames) == 3 and stats.stopped_at_eos and all(int(f[0]) != 2150 for f in frames)


# --- the packed-weight cache ------------------------------------------------------------------

def _reads(monkeypatch) -> list[str]:
    """Names of the checkpoint tensors read (converted to fp32) from now on."""
    from vllm_omni.tts import checkpoint as C

    names, real = [], C._TensorFile.fp32

    def fp32(self, name):
        names.append(name)
        return real(self, name)

    monkeypatch.setattr(C._TensorFile, "fp32", fp32)
    return names


MATRIX_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "codec_head", "lm_head")


def test_a_second_start_reads_the_packed_cache_and_no_large_matrix(tiny_dir, tmp_path, monkeypatch):
    from vllm_omni.tts.weight_cache import cache_path

    ck = _copy(tiny_dir, tmp_path / "ck")
    kw = dict(text="Hello there.", speaker="ryan", language="english", greedy=True, max_frames=6)
    reads = _reads(monkeypatch)
    first = Speech.load(ck, weights="int4", threads=1, max_positions=128)
    assert first.generator.cache.made > 0 and not first.generator.cache.hit and cache_path(ck, "int4").is_file()
    assert any(part in n for n in reads for part in MATRIX_PARTS)  # the first start packed from the file
    a = first.synthesize(**kw)
    reads.clear()
    second = Speech.load(ck, weights="int4", threads=1, max_positions=128)
    assert second.generator.cache.hit and second.generator.cache.made == 0
    assert not [n for n in reads if n.startswith("talker.") and any(part in n for part in MATRIX_PARTS)]
    assert np.array_equal(a, second.synthesize(**kw))
    assert not [f for f in cache_path(ck, "int4").parent.iterdir() if f.name.endswith(".part")]


def test_a_stale_or_broken_cache_is_rebuilt_and_an_unwritable_one_is_skipped(tiny_dir, tmp_path, capsys):
    import os

    from vllm_omni.tts.generate import CodeGenerator
    from vllm_omni.tts.weight_cache import PackedWeights, cache_path

    def start(folder, fmt="int8", **kw):  # the generator alone: the cache is its business, not the decoder's
        return CodeGenerator(load_checkpoint(folder), fmt, 1, max_positions=64, **kw)

    ck = _copy(tiny_dir, tmp_path / "ck")
    start(ck)
    path = cache_path(ck, "int8")
    st = (ck / "model.safetensors").stat()
    os.utime(ck / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the weights changed
    assert "weights_mtime_ns differ" in PackedWeights.open(load_checkpoint(ck), "int8").problem
    assert start(ck).cache.made > 0 and start(ck).cache.hit
    path.write_bytes(b"not a safetensors file")
    assert "unreadable" in PackedWeights.open(load_checkpoint(ck), "int8").problem
    assert start(ck).cache.made > 0
    plain = _copy(tiny_dir, tmp_path / "plain")
    (plain / ".qwen3-tts-edge").write_text("a file where the cache folder would go")
    s = Speech.load(plain, weights="int4", threads=1, max_positions=64)
    assert "packed weights not cached" in capsys.readouterr().err and s.synthesize("Hi.", speaker="ryan", max_frames=2).size
    off = _copy(tiny_dir, tmp_path / "off")
    assert start(off, "int4", cache=False).cache is None and not (off / ".qwen3-tts-edge").exists()


def test_the_talker_and_the_predictor_take_their_own_formats(tiny_dir, tmp_path):
    """``int4+int8``: an int4 talker and an int8 predictor, each read from its format's cache file, which
    keeps what another start packed in it; the first frame's codebook-0 code is the talker's alone."""
    from vllm_omni.tts.generate import CodeGenerator
    from vllm_omni.tts.pipeline import decoder_precision
    from vllm_omni.tts.weight_cache import cache_path
    from vllm_omni.tts.weight_choice import canonical, weight_parts

    assert weight_parts("int4") == ("int4", "int4") and weight_parts("int4+int8") == ("int4", "int8")
    assert canonical("int8+int8") == "int8" and canonical("fp32+int4") == "fp32+int4"
    for bad in ("int5", "int4,int8", "int4+int8+fp32", "+int8", ""):
        with pytest.raises(ValueError, match="TALKER\\+PREDICTOR such as int4\\+int8"):
            weight_parts(bad)
    assert decoder_precision("auto", "fp32+int4") == decoder_precision("auto", "int4")
    assert decoder_precision("auto", "fp32") == "fp32"

    ck = _copy(tiny_dir, tmp_path / "ck")

    def start(fmt):
        return CodeGenerator(load_checkpoint(ck), fmt, 1, max_positions=64)

    four, eight = start("int4"), start("int8")
    mix = start("int4+int8")
    assert (mix.talker.fmt, mix.predictor.fmt, mix.weights) == ("int4", "int8", "int4+int8")
    assert mix.cache is None and len(mix.caches) == 2 and all(c.hit for c in mix.caches)  # both read, nothing packed
    other = start("int8+int4")
    assert (other.talker.fmt, other.predictor.fmt) == ("int8", "int4") and all(c.hit for c in other.caches)
    assert cache_path(ck, "int4").is_file() and cache_path(ck, "int8").is_file()
    fresh = _copy(tiny_dir, tmp_path / "fresh")  # a mix first: each file gets one part
    assert all(c.made > 0 for c in CodeGenerator(load_checkpoint(fresh), "int4+int8", 1, max_positions=64).caches)
    again = CodeGenerator(load_checkpoint(fresh), "int4", 1, max_positions=64)
    assert 0 < again.cache.made and 0 < again.cache.read  # the predictor packed, the talker read from the file
    assert CodeGenerator(load_checkpoint(fresh), "int4", 1, max_positions=64).cache.hit  # and both kept in it

    for command in (["speak", "--text", "x", "--out", "x.wav"], ["serve"], ["serve-cluster"]):
        args = cli.build_parser().parse_args([*command, "--model", str(ck), "--weights", "int4+int8"])
        assert args.weights == "int4+int8"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--model", str(ck), "--weights", "int4,int8"])

    from vllm_omni.tts.generate import Sampling

    prompt = build_prompt(mix.ckpt, "Hello there.", speaker="ryan", language="english")
    c0 = {g: int(next(iter(g.generate(prompt, Sampling(greedy=True), max_frames=3)))[0]) for g in (four, eight, mix, other)}
    assert c0[mix] == c0[four] and c0[other] == c0[eight]


# --- the WAV and the command ------------------------------------------------------------------

def test_an_interrupted_wav_leaves_nothing(tmp_path):
    out = tmp_path / "x.wav"
    with pytest.raises(RuntimeError):
        with WavWriter(out, 24000) as w:
            w.write(np.zeros(1920, dtype=np.float32))
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    with WavWriter(out, 24000) as w:
        w.write(np.linspace(-1, 1, 3840, dtype=np.float32))
    rate, x = read_wav(out)
    assert rate == 24000 and x.shape == (3840,) and abs(x[0] + 1) < 1e-4 and abs(x[-1] - 1) < 1e-4


def test_speak_writes_a_wav_of_whole_frames(tiny_dir, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    rc = cli.main(["speak", "--model", str(tiny_dir), "--text", "Hello, world.", "--speaker", "Ryan",
                   "--language", "English", "--out", str(out), "--weights", "fp32", "--threads", "1",
                   "--max-frames", "6", "--stream", "--quiet"])
    assert rc == 0
    rate, x = read_wav(out)
    assert rate == 24000 and x.size % 1920 == 0 and 1 <= x.size // 1920 <= 6


@pytest.mark.parametrize("args, match", [
    (["--text", "hi", "--speaker", "nobody"], "unknown speaker 'nobody'"),
    (["--text", "hi", "--speaker", "ryan", "--language", "xx"], "unknown language 'xx'"),
    (["--text", "", "--speaker", "ryan"], "the text is empty"),
    (["--speaker", "ryan"], "give the words to speak"),
])
def test_speak_refuses_bad_input_and_writes_nothing(tiny_dir, tmp_path, capsys, args, match):
    out = tmp_path / "x.wav"
    assert cli.main(["speak", "--model", str(tiny_dir), "--out", str(out), *args]) == 2
    assert match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_speak_refuses_bad_paths_and_thread_counts(tiny_dir, tmp_path, capsys):
    base = ["speak", "--text", "hi", "--speaker", "ryan"]
    assert cli.main([*base, "--model", str(tmp_path / "none"), "--out", str(tmp_path / "x.wav")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert cli.main([*base, "--model", str(tiny_dir), "--out", str(tmp_path / "no" / "x.wav")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main([*base, "--model", str(tiny_dir), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*base, "--model", str(tiny_dir), "--out", str(tmp_path / "x.wav"), "--threads", "0"])
    assert "--threads: must be a whole number from 1 to 1024" in capsys.readouterr().err


def test_the_installed_command_writes_a_random_checkpoint_and_speaks(tmp_path):
    exe = Path(sys.executable).parent / "qwen3-tts-edge"
    ck = tmp_path / "ck"
    subprocess.run([exe, "random-checkpoint", "--out", ck, "--talker-layers", "1", "--predictor-layers", "1",
                    "--decoder-layers", "1", "--text-hidden", "256", "--decoder-dim", "384"],
                   check=True, capture_output=True, text=True)
    cfg = load_config(ck)
    assert cfg.spec.text_hidden == 256 and cfg.decoder.spec.decoder_dim == 384
    again = subprocess.run([exe, "random-checkpoint", "--out", ck], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr
    proc = subprocess.run([exe, "speak", "--model", ck, "--text", "Hi.", "--speaker", "aiden", "--out", "-",
                           "--max-frames", "3", "--threads", "2"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout[:4] == b"RIFF" and (len(proc.stdout) - 44) % (1920 * 2) == 0


def test_native_snake_equals_the_formula():
    from vllm_omni.cpu import native

    lib = native.load()
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(6, 3000, generator=g) * s for s in (0.1, 1.0, 30.0)])  # |a x| up to ~1e3
    a = torch.exp(torch.randn(18, generator=g))
    inv_b = torch.rand(18, generator=g) + 0.5
    y = torch.empty_like(x)
    lib.vo_snake(x.data_ptr(), y.data_ptr(), 18, 3000, a.data_ptr(), inv_b.data_ptr(), 2)
    ref = x.double() + inv_b.double()[:, None] * torch.sin(x.double() * a.double()[:, None]) ** 2
    err = (y.double() - ref).abs() / (1 + ref.abs())
    assert float(err.max()) < 2e-6


def test_decoder_paths_agree_native_and_pytorch(speech, monkeypatch):
    """The native GEMV / Snake paths and the PyTorch ones give the same audio (fp32, rounding apart)."""
    import vllm_omni.tts.decoder as D

    codes = torch.randint(0, 2048, (9, 16), generator=torch.Generator().manual_seed(5))
    native_dec = D.StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder)
    assert native_dec.conv_in.rows is not None and native_dec.blocks[0][0].lib is not None
    a = torch.cat([native_dec.push(codes[i:i + 3]) for i in range(0, 9, 3)])
    monkeypatch.setattr(D, "_native", lambda: None)
    plain = D.StreamingDecoder(speech.ckpt.decoder, speech.ckpt.config.decoder)
    assert plain.conv_in.rows is None
    b = torch.cat([plain.push(codes[i:i + 3]) for i in range(0, 9, 3)])
    assert float((a - b).abs().max()) < 1e-4


def test_a_prefill_call_of_many_positions_equals_one_position_at_a_time(speech):
    """The talker prompt goes through the native stack up to vo_max_tokens() positions a call."""
    talker = speech.generator.talker
    n = talker.lib.vo_max_tokens()
    assert n >= 10  # a streaming-text prompt (10 positions) is one call
    x = torch.randn(n + 3, 1024, generator=torch.Generator().manual_seed(2)) * 0.5
    talker.reset()
    out_many, logits_many = talker.native.forward(x[:n], 0, head=talker.head)
    talker.reset()
    rows = []
    for i in range(n):
        out, logits = talker.native.forward(x[i:i + 1], i, head=talker.head)
        rows.append(out[0])
    assert float((torch.stack(rows) - out_many).abs().max()) < 1e-4
    assert float((logits - logits_many).abs().max()) < 1e-4
    with pytest.raises(RuntimeError, match="vo_stack_forward failed"):
        talker.native.forward(x, 0)


def test_a_server_aligns_the_streams_chunks_so_they_decode_together(speech):
    """``Speaking.take(boundary=...)``: past its first chunks (one frame, one, two, two) an utterance ends
    its chunk at the server's shared boundary (every four steps), so that two streams started at
    different steps fill their chunks at the same steps from then on, and every frame is decoded once."""
    from vllm_omni.tts.pipeline import decode_together

    row = torch.zeros(16, dtype=torch.int64)
    a, b = (speech.open(t, speaker="ryan", max_frames=40) for t in ("One.", "Two."))
    due = {"a": [], "b": []}
    decoded = {"a": 0, "b": 0}
    for step in range(1, 25):
        ready = []
        for name, sp, first in (("a", a, 1), ("b", b, 3)):
            if step >= first and sp.take(row, boundary=step % sp.steady == 0):
                due[name].append(step)
                ready.append((name, sp))
                assert sp.opening == (len(due[name]) <= 4)  # the first four chunks: a listener waits for them
        for (name, _), chunk in zip(ready, decode_together([sp for _, sp in ready])):
            decoded[name] += chunk.frames
    assert due["a"][:4] == [1, 2, 4, 6] and due["b"][:4] == [3, 4, 6, 8]  # the first chunks as before
    assert [s for s in due["a"] if s >= 8] == [s for s in due["b"] if s >= 8] == [8, 12, 16, 20, 24]  # then shared
    assert decoded == {"a": 24, "b": 22}
