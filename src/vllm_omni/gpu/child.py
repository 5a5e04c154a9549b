"""One measurement process of ``vllm-omni-bench gpu-frame``: build, capture, time, print JSON.

Why a process per SM cap: MPS reads ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` when a client's
CUDA context is created, so a cap can only be set before CUDA starts in that process. The
parent sets the environment and starts ``python -m vllm_omni.gpu.child '<json config>'``;
this module prints one line ``RESULT_MARK <json>`` on stdout and nothing else there.

With ``{"probe": true}`` it only reports what CUDA device it sees (or why none), so the
parent never has to initialise CUDA itself.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

RESULT_MARK = "VLLM_OMNI_GPU_FRAME"
MODES = ("graph", "eager")
CAP_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


class NoCuda(RuntimeError):
    """torch sees no CUDA device in this process."""


def probe() -> dict[str, Any]:
    """The CUDA device as torch sees it; ``{"cuda": False, "reason": ...}`` when there is none."""
    try:
        import torch
    except ImportError as exc:
        return {"cuda": False, "reason": f"torch is not installed ({exc})"}
    if not torch.cuda.is_available():
        return {"cuda": False, "reason": f"torch {torch.__version__} sees no CUDA device"}
    props = torch.cuda.get_device_properties(0)
    return {
        "cuda": True,
        "device": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
    }


def _median(samples: list[float]) -> float:
    return round(statistics.median(samples), 4)


def time_frames(frame: Any, talker_fn, predictor_fn, *, frames: int, warmup: int) -> dict[str, float]:
    """Medians over ``frames`` frames: GPU time of each part (CUDA events), and the host's wall
    time of the whole frame up to the 16 codes being on the host."""
    import torch

    for _ in range(warmup):
        talker_fn()
        predictor_fn()
    torch.cuda.synchronize()
    host_codes = torch.empty_like(frame.codes, device="cpu")
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    talker, predictor, total, wall = [], [], [], []
    for _ in range(frames):
        t0 = time.perf_counter()
        events[0].record()
        talker_fn()
        events[1].record()
        predictor_fn()
        events[2].record()
        host_codes.copy_(frame.codes)  # a pageable copy: returns once the frame is done
        wall.append((time.perf_counter() - t0) * 1e3)
        events[2].synchronize()
        talker.append(events[0].elapsed_time(events[1]))
        predictor.append(events[1].elapsed_time(events[2]))
        total.append(events[0].elapsed_time(events[2]))
    return {"talker_ms": _median(talker), "predictor_ms": _median(predictor), "frame_ms": _median(total),
            "wall_ms": _median(wall), "frames": frames, "warmup": warmup}


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Build the random-weight model on cuda:0 and time each mode of ``config["modes"]``."""
    import torch

    from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights
    from vllm_omni.gpu.static_frame import StaticFrame, StaticPredictor, StaticTalker, capture
    from vllm_omni.models import get_model

    info = probe()
    if not info["cuda"]:
        raise NoCuda(info["reason"])
    modes = config["modes"]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}; valid: {', '.join(MODES)}")
    t_start = time.perf_counter()
    spec = get_model(config["model"])
    dtype = getattr(torch, config.get("dtype", "bfloat16"))
    cache, frames, warmup = config["cache"], config["frames"], config["warmup"]
    capacity = -(-(cache + warmup + frames + 8) // 64) * 64  # every timed step fits; capture warm-ups are rewound
    tw = random_talker_weights(spec, seed=config["seed"], layers=config["layers"])
    pw = random_predictor_weights(spec, seed=config["seed"])
    with torch.no_grad():
        talker = StaticTalker(tw, capacity=capacity, dtype=dtype, device="cuda")
        predictor = StaticPredictor(pw, dtype=dtype, device="cuda")
        frame = StaticFrame(talker, predictor, tw.codec_embedding, greedy_residuals=config["greedy_residuals"],
                            seed=config["seed"])
        del tw, pw
        talker.prefill(cache, seed=config["seed"])
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - t_start
        results: dict[str, Any] = {}
        for mode in modes:
            if mode == "graph":
                talker.set_position(cache)
                talker_fn, predictor_fn = capture(frame.talker_part), capture(frame.predictor_part)
            else:
                talker_fn, predictor_fn = frame.talker_part, frame.predictor_part
            talker.set_position(cache)
            results[mode] = time_frames(frame, talker_fn, predictor_fn, frames=frames, warmup=warmup)
    return {
        **info,
        "cap_env": os.environ.get(CAP_ENV),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "talker_capacity": capacity,
        "setup_s": round(setup_s, 1),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20),
        "modes": results,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m vllm_omni.gpu.child '<json config>'", file=sys.stderr)
        return 2
    config = json.loads(argv[0])
    try:
        out = probe() if config.get("probe") else measure(config)
    except NoCuda as exc:
        out = {"cuda": False, "reason": str(exc)}
    print(RESULT_MARK, json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
