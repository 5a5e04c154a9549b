"""``vllm-omni-bench project``: the bandwidth + host-work projection as computed artifacts.

Why a command: a computed figure must be regenerable by one line that a reader can retype,
and the test that guards the committed files reruns exactly that line.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from vllm_omni.bench.common import BenchError, add_output, computed_provenance, show_and_write
from vllm_omni.models import MODELS, WEIGHT_FORMATS, get_model
from vllm_omni.models.counts import frame_breakdown
from vllm_omni.projection import (
    DEVICES,
    FRAME_MS,
    STUDY_INPUTS,
    XEON_HOST_MS,
    Device,
    Projection,
    custom_device,
    get_device,
    project_spec,
    project_study_inputs,
)
from vllm_omni.results.schema import validate

AREA = "device-simulation"

PROJECTION_COLUMNS = [
    {"name": "device", "unit": None, "type": "text"},
    {"name": "bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
    {"name": "talker read", "unit": "GB", "type": "number", "format": ".3f"},
    {"name": "predictor read (15 passes)", "unit": "GB", "type": "number", "format": ".3f"},
    {"name": "projection read", "unit": "GB", "type": "number", "format": ".3f"},
    {"name": "frame read", "unit": "GB", "type": "number", "format": ".3f"},
    {"name": "weight streaming", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "host work", "unit": "ms", "type": "number", "format": ".1f"},
    {"name": "projected", "unit": "ms/frame", "type": "number", "format": ".1f"},
    {"name": "RTF", "unit": None, "type": "number", "format": ".2f"},
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "project",
        help="project ms/frame and RTF per device from weight bytes and bandwidth",
        description=(
            "Project ms per 80 ms frame and RTF as weight streaming (bytes per frame / datasheet "
            "bandwidth) plus host-side runner work. Writes computed artifacts under "
            f"results/{AREA}/."
        ),
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--study-inputs", action="store_true",
                      help="use the study's own inputs (1.2 GB talker + 2.4 GB predictor, bf16) instead of a "
                           "model's weight bytes")
    what.add_argument("--frame-bytes", action="store_true",
                      help="write the bytes-per-frame table for every model size and weight format, and the "
                           "0.6B talker's candidate sizes (no devices)")
    p.add_argument("--model", default=None,
                   help=f"model size: {', '.join(MODELS)} (default 0.6B; not with --study-inputs or --frame-bytes)")
    p.add_argument("--weights", default=None,
                   help=f"weight format: {', '.join(WEIGHT_FORMATS)}, or 'all' (default bf16; not with "
                        "--study-inputs or --frame-bytes)")
    p.add_argument("--device", action="append", default=None,
                   help=f"device key, repeatable (default: all of {', '.join(DEVICES)})")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="project for a custom device with this bandwidth (GB/s) instead")
    p.add_argument("--host-ms", type=float, default=None,
                   help=f"host-side work per frame for --bandwidth-gbs (default {XEON_HOST_MS:g} ms)")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    add_output(p)
    p.set_defaults(func=run)


# --- artifact builders (also used by the tests) ------------------------------------------------

def _provenance(command: str, *, model: str | None, quantization: str | None, source: str,
                weights: str = "none: analytic, from the published shapes") -> dict[str, Any]:
    return computed_provenance(command, source=source, model=model, weights=weights, quantization=quantization)


def _row(p: Projection) -> list[Any]:
    return [
        p.device.name, p.device.bandwidth_gbs,
        round(p.talker_bytes / 1e9, 6), round(p.predictor_bytes / 1e9, 6), round(p.other_bytes / 1e9, 6),
        round(p.total_bytes / 1e9, 6), round(p.streaming_ms, 4), round(p.host_ms, 4),
        round(p.ms_per_frame, 4), round(p.rtf, 4),
    ]


def _devices_extra(devices: list[Device]) -> dict[str, Any]:
    return {d.key: {"name": d.name, "bandwidth_gbs": d.bandwidth_gbs, "host_scale": d.host_scale,
                    "host_ms": d.host_ms, "sm_count": d.sm_count, "source": d.source} for d in devices}


def study_inputs_artifact(devices: list[Device], command: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "id": f"{AREA}/projection-study-inputs",
        "title": "Projection recomputed from the study's own inputs (0.6B, bf16, 3.6 GB per frame)",
        "origin": "computed",
        "provenance": _provenance(command, model="Qwen3-TTS-12Hz-0.6B", quantization="bf16",
                                  source="vllm-omni-bench project, inputs transcribed from the study summary §4",
                                  weights="none: analytic, from the study's stated bytes per frame"),
        "columns": PROJECTION_COLUMNS,
        "rows": [_row(project_study_inputs(d)) for d in devices],
        "notes": (
            f"Inputs as the study states them: talker {STUDY_INPUTS['talker_bytes'] / 1e9:g} GB and "
            f"predictor {STUDY_INPUTS['predictor_bytes'] / 1e9:g} GB per frame; host work "
            f"{XEON_HOST_MS:g} ms on the Xeon host times each device's single-core slowdown. "
            f"RTF is projected ms over the {FRAME_MS:g} ms frame."
        ),
        "extra": {"inputs": dict(STUDY_INPUTS), "devices": _devices_extra(devices)},
    }


def spec_artifact(model: str, fmt: str, devices: list[Device], command: str) -> dict[str, Any]:
    spec = get_model(model)
    b = frame_breakdown(spec, fmt)
    return {
        "schema": 1,
        "id": f"{AREA}/projection-spec-{model.lower()}-{fmt}",
        "title": f"Projection from the model spec: {model}, {fmt} weights ({b.total / 1e9:.2f} GB per frame)",
        "origin": "computed",
        "provenance": _provenance(command, model=spec.name, quantization=fmt,
                                  source="vllm-omni-bench project, bytes from vllm_omni.models"),
        "columns": PROJECTION_COLUMNS,
        "rows": [_row(project_spec(d, model, fmt)) for d in devices],
        "notes": (
            "Talker read: 28 blocks + final norm + codec_head once per frame. Predictor read: "
            "15 passes of 5 blocks + final norm + one lm_head. Projection read: 1.7B's "
            "small_to_mtp_projection, 15 uses. Embedding rows and the KV cache are not counted. "
            "Norms and biases at bf16 for bf16 weights, fp32 otherwise."
        ),
        "extra": {"bytes": {"talker": b.talker, "predictor_pass": b.predictor_pass, "predictor": b.predictor,
                            "projection": b.projection, "total": b.total},
                  "devices": _devices_extra(devices)},
    }


FRAME_BYTES_COLUMNS = [
    {"name": "model and weights", "unit": None, "type": "text"},
    {"name": "talker step", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "predictor pass", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "predictor, 15 passes", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "projection, 15 uses", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "frame", "unit": "GB", "type": "number", "format": ".3f"},
    {"name": "bandwidth for real time", "unit": "GB/s", "type": "number", "format": ".1f"},
]


def frame_bytes_artifact(command: str) -> dict[str, Any]:
    rows = []
    for size in MODELS:
        for fmt in WEIGHT_FORMATS:
            b = frame_breakdown(get_model(size), fmt)
            rows.append([f"{size} {fmt}", b.talker / 1e6, b.predictor_pass / 1e6, b.predictor / 1e6,
                         b.projection / 1e6, b.total / 1e9, round(b.total / (FRAME_MS / 1e3) / 1e9, 4)])
    return {
        "schema": 1,
        "id": f"{AREA}/frame-bytes",
        "title": "Weight bytes read per 80 ms frame, by model size and weight format",
        "origin": "computed",
        "provenance": _provenance(command, model="Qwen3-TTS-12Hz-0.6B and 1.7B", quantization="fp32, bf16, int8, int4",
                                  source="vllm-omni-bench project, bytes from vllm_omni.models"),
        "columns": FRAME_BYTES_COLUMNS,
        "rows": rows,
        "notes": (
            "int8: 1 B per weight + one fp32 scale per output row. int4: 0.5 B per weight + one fp16 "
            "scale per 32 inputs (4.5 bits). Norms and biases at bf16 for bf16 weights, fp32 otherwise. "
            "Bandwidth for real time: frame bytes x 12.5 frames/s, the streaming term alone."
        ),
    }


def talker_candidates_artifact(command: str) -> dict[str, Any]:
    """Which part of the 0.6B checkpoint could the study's 1.2 GB talker figure be?"""
    from vllm_omni.models import talker_frame_bytes, talker_own_params, talker_params

    m = get_model("0.6B")
    own = talker_own_params(m)
    rows = [
        ["talker step: 28 blocks + final norm + codec_head (read every frame)", talker_frame_bytes(m, "bf16") / 1e9],
        ["28 blocks + text_embedding (text_embedding is read only at prefill)",
         2 * (own["layers"] + own["text_embedding"]) / 1e9],
        ["talker modules without the code predictor", 2 * sum(own.values()) / 1e9],
        ["whole checkpoint incl. the code predictor", 2 * talker_params(m) / 1e9],
        ["0.6e9 parameters (the size in the model's name) x 2 B", 0.6e9 * 2 / 1e9],
    ]
    return {
        "schema": 1,
        "id": f"{AREA}/talker-bytes-0.6b",
        "title": "Candidate readings of a 0.6B talker's bf16 size",
        "origin": "computed",
        "provenance": _provenance(command, model=m.name, quantization="bf16",
                                  source="vllm-omni-bench project, parameter counts from vllm_omni.models"),
        "columns": [{"name": "what is counted", "unit": None, "type": "text"},
                    {"name": "bf16 bytes", "unit": "GB", "type": "number", "format": ".3f"}],
        "rows": [[k, round(v, 6)] for k, v in rows],
        "notes": "Only the first row is streamed per frame; the others are what a checkpoint-size estimate might count.",
    }


# --- the command -------------------------------------------------------------------------------

def _command(args: argparse.Namespace) -> str:
    """The command as a reader retypes it; --output and --no-write are left out on purpose."""
    parts = ["vllm-omni-bench", "project"]
    if args.study_inputs:
        parts.append("--study-inputs")
    elif args.frame_bytes:
        parts.append("--frame-bytes")
    else:
        parts += ["--model", args.model, "--weights", args.weights]
    for d in args.device or []:
        parts += ["--device", d]
    if args.bandwidth_gbs is not None:
        parts += ["--bandwidth-gbs", f"{args.bandwidth_gbs:g}"]
    if args.host_ms is not None:
        parts += ["--host-ms", f"{args.host_ms:g}"]
    return shlex.join(parts)


def _devices(args: argparse.Namespace) -> list[Device]:
    try:
        if args.bandwidth_gbs is not None:
            if args.device:
                raise ValueError("give either --device or --bandwidth-gbs, not both")
            host = XEON_HOST_MS if args.host_ms is None else args.host_ms
            return [custom_device(args.bandwidth_gbs, host)]
        if args.host_ms is not None:
            raise ValueError("--host-ms goes with --bandwidth-gbs; known devices carry their own host work")
        return [get_device(k) for k in (args.device or list(DEVICES))]
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def build(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The artifacts this invocation produces (validated, not yet written)."""
    if args.study_inputs or args.frame_bytes:  # tables with inputs of their own: an option they ignore is refused
        given = {"--model": args.model, "--weights": args.weights}
        if args.frame_bytes:
            given.update({"--device": args.device, "--bandwidth-gbs": args.bandwidth_gbs, "--host-ms": args.host_ms})
        ignored = [flag for flag, value in given.items() if value is not None]
        if ignored:
            mode = "--study-inputs" if args.study_inputs else "--frame-bytes"
            raise BenchError(f"{mode} has inputs of its own and takes no {', '.join(ignored)}")
    else:
        args.model, args.weights = args.model or "0.6B", args.weights or "bf16"
    command = _command(args)
    if args.frame_bytes:
        arts = [frame_bytes_artifact(command), talker_candidates_artifact(command)]
    elif args.study_inputs:
        arts = [study_inputs_artifact(_devices(args), command)]
    else:
        if args.model not in MODELS:
            raise BenchError(f"unknown model size {args.model!r}; valid: {', '.join(MODELS)}")
        formats = list(WEIGHT_FORMATS) if args.weights == "all" else [args.weights]
        if any(f not in WEIGHT_FORMATS for f in formats):
            raise BenchError(f"unknown weight format {args.weights!r}; valid: {', '.join(WEIGHT_FORMATS)}, all")
        devices = _devices(args)
        arts = [spec_artifact(args.model, f, devices, command) for f in formats]
    if args.bandwidth_gbs is not None:  # a custom device never overwrites the committed tables
        for a in arts:
            a["id"] += "-custom"
    for a in arts:
        validate(a)
    return arts


def run(args: argparse.Namespace) -> int:
    return show_and_write(build(args), args)
