"""The official implementation's side of the equality tests, run in its own environment.

``qwen-tts`` 0.1.1 pins transformers 4.57.3, which the main environment does not have, so the
tests and the end-to-end benchmark run this file with the interpreter of ``.venv-official``
(built by ``make test``) and talk to it through files (``vllm_omni.testing.official``). It only calls the official package: it writes a checkpoint with the
official classes, and it runs the official tokenizer, generate and decode on one.

    python qwen_tts_side.py write DIR CONFIGS.json SEED
    python qwen_tts_side.py run DIR REQUEST.json OUT.npz
    python qwen_tts_side.py clone DIR REQUEST.json OUT.npz
    python qwen_tts_side.py bench DIR REQUEST.json OUT.json
    python qwen_tts_side.py bench_clone DIR REQUEST.json OUT.json

``write`` instantiates ``Qwen3TTSForConditionalGeneration`` and ``Qwen3TTSTokenizerV2Model``
from the given configs, sets every parameter by name from ``vllm_omni.tts.random_weights`` (the
same rule our writer uses; PYTHONPATH carries the project's ``src``), and saves them with
``save_pretrained``; the JSON files are then written as the published checkpoints have them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch


def write(root: Path, configs_path: Path, seed: int) -> None:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    from vllm_omni.tts.random_checkpoint import write_configs, write_tokenizer
    from vllm_omni.tts.random_weights import init_tensor

    configs = json.loads(configs_path.read_text())
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**configs["config.json"])).eval()
    speech_cfg = dict(configs["speech_tokenizer/config.json"])
    speech = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**speech_cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_tensor(name, tuple(p.shape), seed))
        base = "speaker_encoder_config" in configs["config.json"]  # a Base checkpoint: its 12 Hz encoder too
        for name, p in list(speech.named_parameters()) + list(speech.named_buffers()):
            if name.startswith("decoder.") or (base and name.startswith("encoder.")):
                p.copy_(init_tensor(name, tuple(p.shape), seed))
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root, safe_serialization=True)
    speech.save_pretrained(root / "speech_tokenizer", safe_serialization=True)
    write_configs(root, configs)  # the published JSON (save_pretrained adds keys the loader refuses)
    write_tokenizer(root)


def _generate(tts, p: dict, do_sample):
    """The official generate for one prompt, as ``generate_custom_voice`` calls it: the codes of its frames."""
    input_ids = tts._tokenize_texts([tts._build_assistant_text(p["text"])])
    kwargs = tts._merge_generate_kwargs(do_sample=do_sample, subtalker_dosample=do_sample,
                                        max_new_tokens=p["max_new_tokens"])
    instruct = p.get("instruct")
    instruct_ids = [tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None]
    codes, _ = tts.model.generate(input_ids=input_ids, instruct_ids=instruct_ids, languages=[p["language"]],
                                  speakers=[p["speaker"]], non_streaming_mode=p["non_streaming_mode"], **kwargs)
    return codes


def run(root: Path, request_path: Path, out_path: Path) -> None:
    from qwen_tts import Qwen3TTSModel

    req = json.loads(request_path.read_text())
    tts = Qwen3TTSModel.from_pretrained(str(root), device_map="cpu", dtype=torch.float32)
    out: dict[str, np.ndarray] = {}
    for i, text in enumerate(req.get("tokenize", [])):
        ids = tts.processor(text=text, return_tensors="pt")["input_ids"][0]
        out[f"ids_{i}"] = ids.numpy().astype(np.int64)
    for i, p in enumerate(req.get("prompts", [])):
        codes = _generate(tts, p, do_sample=False)
        out[f"codes_{i}"] = codes[0].numpy().astype(np.int64)
        if len(codes[0]):
            wavs, _ = tts.model.speech_tokenizer.decode([{"audio_codes": codes[0]}])
            out[f"wav_codes_{i}"] = np.asarray(wavs[0], dtype=np.float32)
    if req.get("decode"):
        data = np.load(req["decode"])
        for key in sorted(data.files):
            wavs, sr = tts.model.speech_tokenizer.decode([{"audio_codes": torch.from_numpy(data[key])}])
            out[f"wav_{key}"] = np.asarray(wavs[0], dtype=np.float32)
            out["sample_rate"] = np.asarray(sr)
    np.savez(out_path, **out)


def clone(root: Path, request_path: Path, out_path: Path) -> None:
    """Voice cloning as the official wrapper does it, with each intermediate kept: per reference, the
    waveform ``librosa.load`` reads, the 24 kHz one the tokenizer and the speaker encoder take, the
    mel, the speaker embedding and the reference codes; per request, the greedy codes of
    ``model.generate`` (the call ``generate_voice_clone`` makes) and the audio ``generate_voice_clone``
    returns (reference codes decoded in front, then cut)."""
    import librosa
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    req = json.loads(request_path.read_text())
    tts = Qwen3TTSModel.from_pretrained(str(root), device_map="cpu", dtype=torch.float32)
    out: dict[str, np.ndarray] = {}
    for i, ref in enumerate(req.get("references", [])):
        wav, sr = tts._normalize_audio_inputs([ref["audio"]])[0]
        wav24 = librosa.resample(y=wav.astype(np.float32), orig_sr=int(sr), target_sr=24000) if sr != 24000 else wav
        out[f"ref_{i}_wav"], out[f"ref_{i}_sr"], out[f"ref_{i}_wav24"] = wav, np.asarray(sr), wav24
        mel = mel_spectrogram(torch.from_numpy(wav24).unsqueeze(0), n_fft=1024, num_mels=128, sampling_rate=24000,
                              hop_size=256, win_size=1024, fmin=0, fmax=12000)
        out[f"ref_{i}_mel"] = mel[0].numpy()
        out[f"ref_{i}_embedding"] = tts.model.extract_speaker_embedding(audio=wav24, sr=24000).float().numpy()
        out[f"ref_{i}_codes"] = tts.model.speech_tokenizer.encode(wav, sr=sr).audio_codes[0].numpy().astype(np.int64)
    for i, p in enumerate(req.get("prompts", [])):
        items = tts.create_voice_clone_prompt(ref_audio=p["ref_audio"], ref_text=p.get("ref_text"),
                                              x_vector_only_mode=p["x_vector_only"])
        prompt = tts._prompt_items_to_voice_clone_prompt(items)
        input_ids = tts._tokenize_texts([tts._build_assistant_text(p["text"])])
        ref_ids = [tts._tokenize_texts([tts._build_ref_text(it.ref_text)])[0] if it.ref_text else None for it in items]
        kwargs = tts._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=p["max_new_tokens"])
        codes, _ = tts.model.generate(input_ids=input_ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                      languages=[p["language"]], non_streaming_mode=p["non_streaming_mode"], **kwargs)
        out[f"codes_{i}"] = codes[0].numpy().astype(np.int64)
        if len(codes[0]):
            wavs, _ = tts.generate_voice_clone(text=p["text"], language=p["language"], voice_clone_prompt=items,
                                               non_streaming_mode=p["non_streaming_mode"], do_sample=False,
                                               subtalker_dosample=False, max_new_tokens=p["max_new_tokens"])
            out[f"wav_{i}"] = np.asarray(wavs[0], dtype=np.float32)
    import soxr

    out["soxr_version"] = np.asarray(soxr.__version__)
    np.savez(out_path, **out)


def bench(root: Path, request_path: Path, out_path: Path) -> None:
    """Wall times of the official load, generate and decode (fp32, CPU), for the benchmark."""
    import time

    req, tts, out = _timed_load(root, request_path)
    for p in req["prompts"]:
        for _ in range(int(req.get("repeats", 1))):
            t1 = time.perf_counter()
            codes = _generate(tts, p, do_sample=req.get("do_sample"))
            t2 = time.perf_counter()
            wavs, _ = tts.model.speech_tokenizer.decode([{"audio_codes": codes[0]}])
            t3 = time.perf_counter()
            out["runs"].append({"text": p["text"], "non_streaming_mode": p["non_streaming_mode"],
                                "frames": int(len(codes[0])), "samples": int(len(wavs[0])),
                                "generate_s": t2 - t1, "decode_s": t3 - t2})
    frames = int(req.get("decode_frames", 0))
    if frames:
        codes = torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(int(req.get("repeats", 1))):
            t1 = time.perf_counter()
            tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
            times.append(time.perf_counter() - t1)
        out["decode_only"] = {"frames": frames, "seconds": times}
    out_path.write_text(json.dumps(out))


def bench_clone(root: Path, request_path: Path, out_path: Path) -> None:
    """Wall times of the official cloning (fp32, CPU), for the benchmark: per mode and repeat,
    ``create_voice_clone_prompt`` on the reference file, then ``generate_voice_clone`` with that prompt
    (sampled, as its defaults say), its decode and cut included."""
    import time

    req, tts, out = _timed_load(root, request_path)
    for mode in ("x_vector", "icl"):
        xv = mode == "x_vector"
        tts.create_voice_clone_prompt(ref_audio=req["reference"], ref_text=req["ref_text"], x_vector_only_mode=xv)
        for _ in range(int(req.get("repeats", 1))):
            t1 = time.perf_counter()
            items = tts.create_voice_clone_prompt(ref_audio=req["reference"], ref_text=req["ref_text"],
                                                  x_vector_only_mode=xv)
            t2 = time.perf_counter()
            wavs, _ = tts.generate_voice_clone(text=req["text"], language=req["language"], voice_clone_prompt=items,
                                               max_new_tokens=int(req["max_new_tokens"]))
            t3 = time.perf_counter()
            out["runs"].append({"mode": mode, "prompt_s": t2 - t1, "generate_s": t3 - t2,
                                "frames": round(len(wavs[0]) / 1920)})
    out_path.write_text(json.dumps(out))


def _timed_load(root: Path, request_path: Path):
    """A benchmark's request, the official model loaded on its thread count, and the result with the load time."""
    import time

    req = json.loads(request_path.read_text())
    torch.set_num_threads(int(req["threads"]))
    t0 = time.perf_counter()
    from qwen_tts import Qwen3TTSModel

    tts = Qwen3TTSModel.from_pretrained(str(root), device_map="cpu", dtype=torch.float32)
    return req, tts, {"load_s": time.perf_counter() - t0, "threads": torch.get_num_threads(), "runs": [],
                      "versions": _versions()}


def _versions() -> dict[str, str]:
    import qwen_tts
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "qwen_tts": getattr(qwen_tts, "__version__", None) or "0.1.1"}


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "write":
        write(Path(args[0]), Path(args[1]), int(args[2]))
    elif cmd == "run":
        run(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "clone":
        clone(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "bench_clone":
        bench_clone(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "bench":
        bench(Path(args[0]), Path(args[1]), Path(args[2]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
