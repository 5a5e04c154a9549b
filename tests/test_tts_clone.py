"""Voice cloning on a small random Base checkpoint written by our writer: loading, reference audio, voice files,
the prompt, the primed decoder, the command, and every refusal naming its file or field.

The comparison with the official implementation is tests/test_tts_clone_official.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from vllm_omni.tts import cli
from vllm_omni.tts.checkpoint import load_checkpoint
from vllm_omni.tts.config import CheckpointError, load_config
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.prompt import PromptError
from vllm_omni.tts.random_checkpoint import write_random_checkpoint
from vllm_omni.tts.reference_audio import MAX_SECONDS, ReferenceAudioError, read_reference, resample
from vllm_omni.tts.voice import VoiceError, check_voice, load_voice, save_voice
from vllm_omni.tts.voice_prompt import build_voice_prompt
from vllm_omni.tts.wav import read_wav

SPEECH = Path(__file__).parent / "fixtures" / "speech"
EN = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old tree."
SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=192, encoder_layers=2)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("base") / "base", "0.6B", dtype="fp32", model_type="base",
                                   **SHAPE)


@pytest.fixture(scope="module")
def custom_dir(tmp_path_factory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("custom") / "custom", "0.6B", dtype="fp32", talker_layers=1,
                                   predictor_layers=1, decoder_layers=1, text_hidden=64, decoder_dim=96)


@pytest.fixture(scope="module")
def speech(base_dir) -> Speech:
    return Speech.load(base_dir, weights="fp32", threads=2, max_positions=512)


@pytest.fixture(scope="module")
def voice(speech):
    return speech.clone(SPEECH / "reference-en.wav", EN)


def test_a_base_checkpoint_loads_with_its_encoders(base_dir):
    cfg = load_config(base_dir)
    assert cfg.clones and cfg.family == "Qwen3-TTS-12Hz-0.6B-Base" and not cfg.speakers
    assert cfg.speaker_encoder.dim == 1024 and cfg.speech_encoder.samples_per_frame == 1920
    assert cfg.speech_encoder.layers == 2 and cfg.speech_encoder.valid_quantizers == 16
    ck = load_checkpoint(base_dir)
    assert ck.speaker_encoder_weights()["speaker_encoder.fc.weight"].shape == (1024, 3072, 1)


def _edit_tensor(src: Path, dst: Path, file: str, name: str, value) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / file))
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    save_file(tensors, str(dst / file), metadata={"format": "pt"})
    return dst


def test_a_missing_or_misshaped_encoder_tensor_is_named_before_any_work(base_dir, tmp_path):
    bad = _edit_tensor(base_dir, tmp_path / "a", "model.safetensors", "speaker_encoder.fc.weight", None)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'speaker_encoder\.fc\.weight' is missing"):
        load_checkpoint(bad)
    name = "encoder.downsample.conv.weight"
    bad = _edit_tensor(base_dir, tmp_path / "b", "speech_tokenizer/model.safetensors", name, torch.zeros(512, 512, 3))
    with pytest.raises(CheckpointError, match=rf"speech_tokenizer/model\.safetensors: tensor '{name}' has shape"):
        load_checkpoint(bad)


def test_a_bad_encoder_config_names_its_field(base_dir, tmp_path):
    bad = tmp_path / "c"
    shutil.copytree(base_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["speaker_encoder_config"]["enc_dim"] = 512
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="speaker_encoder_config.enc_dim.* must equal talker_config.hidden_size"):
        load_config(bad)


# --- reference audio ---------------------------------------------------------------------------

def test_reference_formats_rates_and_channels(tmp_path):
    en, rate = sf.read(SPEECH / "reference-en.wav", dtype="float32")
    a = read_reference(SPEECH / "reference-en.wav")
    assert a.source_rate == rate == 22050 and a.source_channels == 1
    assert a.samples.dtype == np.float32 and a.samples.shape == (int(np.ceil(len(en) * 24000 / 22050)),)
    sf.write(tmp_path / "s.flac", np.stack([en, np.zeros_like(en)], axis=1), 22050, format="FLAC")
    b = read_reference(tmp_path / "s.flac")
    assert b.source_channels == 2
    assert np.abs(b.samples - resample(en * 0.5, 22050)).max() < 1e-4  # FLAC is 16-bit: within its rounding
    sf.write(tmp_path / "s.ogg", en, 22050, format="OGG", subtype="VORBIS")
    assert read_reference(tmp_path / "s.ogg").samples.shape == a.samples.shape
    assert read_reference((tmp_path / "s.flac").read_bytes(), name="upload").source_channels == 2


@pytest.mark.parametrize("case", ["missing", "text", "truncated", "short", "long", "silent", "empty", "nan"])
def test_unusable_reference_audio_is_refused_by_name(tmp_path, case):
    path = tmp_path / f"{case}.wav"
    if case == "text":
        path.write_text("this is not audio")
    elif case == "truncated":
        path.write_bytes((SPEECH / "reference-en.wav").read_bytes()[:30])
    elif case == "short":
        sf.write(path, np.full(8000, 0.1, dtype=np.float32), 16000)
    elif case == "long":
        sf.write(path, np.full(int(8000 * (MAX_SECONDS + 1)), 0.1, dtype=np.float32), 8000)
    elif case == "silent":
        sf.write(path, np.zeros(48000, dtype=np.float32), 24000)
    elif case == "nan":
        sf.write(path, np.full(48000, np.nan, dtype=np.float32), 24000, subtype="FLOAT")
    expected = {"missing": "no such file", "text": "not audio that libsndfile reads", "truncated": "not audio",
                "short": "at least 1 s", "long": "at most 30 s", "silent": "silent", "empty": "empty",
                "nan": "not finite"}[case]
    source = b"" if case == "empty" else path
    with pytest.raises(ReferenceAudioError, match=expected) as exc:
        read_reference(source, name=None if case != "empty" else "upload.wav")
    assert ("upload.wav" if case == "empty" else path.name) in str(exc.value)


# --- voices ------------------------------------------------------------------------------------

def test_clone_modes_and_refusals(speech, voice):
    assert voice.icl and voice.codes.shape[1] == 16 and voice.codes.shape[0] == -(-read_reference(
        SPEECH / "reference-en.wav").samples.shape[0] // 1920)
    assert voice.embedding.shape == (1024,) and voice.ref_ids and voice.ref_text == EN
    xv = speech.clone(SPEECH / "reference-en.wav", x_vector_only=True)
    assert xv.mode == "x_vector" and xv.codes is None and torch.equal(xv.embedding, voice.embedding)
    with pytest.raises(VoiceError, match="ref_text is required") as exc:
        speech.clone(SPEECH / "reference-en.wav")
    assert exc.value.param == "ref_text"
    with pytest.raises(VoiceError, match="ref_text is required"):
        speech.clone(SPEECH / "reference-en.wav", "   ")


def test_voice_files_round_trip_and_refuse_others(speech, voice, custom_dir, tmp_path):
    path = save_voice(voice, tmp_path / "me.voice")
    assert [p.name for p in tmp_path.iterdir()] == ["me.voice"]  # no part file left
    back = speech.load_voice(path)
    assert back.mode == "icl" and torch.equal(back.embedding, voice.embedding) and torch.equal(back.codes, voice.codes)
    assert back.ref_ids == voice.ref_ids and back.ref_text == EN and back.reference["rate"] == 22050
    corrupt = tmp_path / "corrupt.voice"
    corrupt.write_bytes(path.read_bytes()[:100])
    with pytest.raises(VoiceError, match="corrupt.voice: not a readable voice file"):
        load_voice(corrupt)
    other = write_random_checkpoint(tmp_path / "other", "0.6B", dtype="fp32", model_type="base", seed=1, **SHAPE)
    with pytest.raises(VoiceError, match="made with another Qwen3-TTS-12Hz-0.6B-Base checkpoint"):
        check_voice(back, load_checkpoint(other), where=str(path))
    big = write_random_checkpoint(tmp_path / "big", "1.7B", model_type="base", talker_layers=1, predictor_layers=1,
                                  decoder_layers=1, text_hidden=64, decoder_dim=96, encoder_layers=1)
    with pytest.raises(VoiceError, match="another model size"):
        check_voice(back, load_checkpoint(big), where=str(path))
    with pytest.raises(VoiceError, match="does not speak in cloned voices"):
        check_voice(back, load_checkpoint(custom_dir), where=str(path))


def test_the_prompt_places_the_reference_before_the_text(speech, voice):
    ck = speech.ckpt
    xv = speech.clone(SPEECH / "reference-en.wav", x_vector_only=True)
    plain = build_voice_prompt(ck, "Hello there.", xv, language="english")
    icl = build_voice_prompt(ck, "Hello there.", voice, language="english")
    # both start alike (role, codec prefix with the embedding); ICL adds bos + every reference frame
    head = 3 + 4 + 1 + 1  # role, think tags with the language, speaker slot, pad
    assert torch.equal(plain.prefill[:head], icl.prefill[:head])
    assert icl.prefill.shape[0] == head + 1 + voice.codes.shape[0]
    assert plain.prefill.shape[0] == head + 1
    non_streaming = build_voice_prompt(ck, "Hello there.", voice, language="english", streaming_text=False)
    assert non_streaming.prefill.shape[0] == head + len(voice.ref_ids) + len(icl.text_ids) + 1 + 1 + voice.codes.shape[0]


def test_a_primed_stream_is_the_tail_of_one_whole_decode(speech, voice):
    chunks = list(speech.stream("Hello there, this is me.", voice=voice, greedy=True, max_frames=6))
    ours = np.concatenate([c.samples for c in chunks])
    codes = torch.cat([voice.codes, torch.stack(_codes(speech, voice))])
    whole = speech.decoder.decode(codes).numpy()
    assert ours.shape == (6 * 1920,)
    assert np.abs(ours - whole[voice.codes.shape[0] * 1920:]).max() < 1e-4


def test_priming_equals_pushing_every_reference_frame(speech):
    from vllm_omni.tts.decoder import StreamingDecoder

    ck = speech.ckpt
    dec = StreamingDecoder(ck.decoder, ck.config.decoder)
    g = torch.Generator().manual_seed(0)
    ref, new = torch.randint(0, 2048, (60, 16), generator=g), torch.randint(0, 2048, (6, 16), generator=g)
    assert 3 < dec.conv_reach_frames() < 20
    whole = dec.decode(torch.cat([ref, new]))[60 * 1920:]
    dec.reset()
    dec.prime(ref)
    assert dec.position == 60
    assert torch.abs(torch.cat([dec.push(new[:1]), dec.push(new[1:])]) - whole).max() < 1e-4


def _codes(speech, voice):
    s = speech.open("Hello there, this is me.", voice=voice, greedy=True, max_frames=6)
    return list(speech.generator.generate(s.prompt, s.sampling, max_frames=6))


def test_options_of_the_other_kind_are_refused(speech, voice):
    with pytest.raises(PromptError, match="give a voice") as exc:
        speech.open("Hello.")
    assert exc.value.param == "voice"
    with pytest.raises(PromptError, match="no preset speakers") as exc:
        speech.open("Hello.", speaker="ryan", voice=voice)
    assert exc.value.param == "speaker"
    with pytest.raises(PromptError, match="takes no speaking instruction"):
        speech.open("Hello.", voice=voice, instruct="Whisper.")


def test_clone_then_speak_with_the_command(base_dir, tmp_path):
    exe = str(Path(sys.executable).parent / "qwen3-tts-edge")
    out = tmp_path / "me.voice"
    r = subprocess.run([exe, "clone", "--model", str(base_dir), "--ref-audio", str(SPEECH / "reference-en.wav"),
                        "--ref-text", EN, "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "in context" in r.stderr and out.is_file()
    wav = tmp_path / "hello.wav"
    r = subprocess.run([exe, "speak", "--model", str(base_dir), "--voice", str(out), "--text", "Hello.",
                        "--weights", "fp32", "--max-frames", "4", "--out", str(wav)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rate, samples = read_wav(wav)
    assert rate == 24000 and samples.shape == (4 * 1920,)


@pytest.mark.parametrize("argv,message", [
    (["clone", "--ref-audio", "REF", "--out", "OUT"], "--ref-text is required"),
    (["clone", "--ref-audio", "REF", "--ref-text", "hi", "--out", "OUT", "--model", "CUSTOM"], "has no speaker encoder"),
    (["speak", "--text", "Hi.", "--out", "WAV"], "give --voice FILE .* or --ref-audio FILE, not neither"),
    (["speak", "--text", "Hi.", "--out", "WAV", "--speaker", "ryan"], "--speaker: .* speaks in a voice cloned"),
    (["speak", "--text", "Hi.", "--out", "WAV", "--voice", "MISSING"], "--voice .*: no such voice file"),
    (["speak", "--text", "Hi.", "--out", "WAV", "--voice", "OUT", "--model", "CUSTOM", "--speaker", "ryan"],
     "--voice: .* preset or described voices"),
    (["speak", "--text", "Hi.", "--out", "WAV", "--ref-audio", "TEXTFILE", "--x-vector-only"], "not audio"),
])
def test_command_refusals_name_the_option(base_dir, custom_dir, tmp_path, argv, message, capsys):
    custom = custom_dir
    (tmp_path / "text.wav").write_text("not audio")
    subs = {"REF": str(SPEECH / "reference-en.wav"), "OUT": str(tmp_path / "x.voice"), "WAV": str(tmp_path / "o.wav"),
            "CUSTOM": str(custom), "MISSING": str(tmp_path / "missing.voice"), "TEXTFILE": str(tmp_path / "text.wav")}
    (tmp_path / "x.voice").write_bytes(b"")
    args = [subs.get(a, a) for a in argv]
    if "--model" not in args:
        args += ["--model", str(base_dir)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "o.wav").exists()
