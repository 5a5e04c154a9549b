"""Analytic projection of ms per frame and real-time factor on devices we cannot run on.

Why: SM caps emulate compute but not memory bandwidth, and at batch 1 a talker step is
bound by bandwidth. The model here is a floor, not a measurement:

    ms/frame = weight bytes per frame / datasheet bandwidth + host-side runner work
    RTF      = ms/frame / 80 ms

Host-side runner work (input preparation, copies, bookkeeping) is ≈4 ms on the study's
Xeon host and is scaled by each device's single-core speed relative to it; the scale
factors are the ones the study's §4 table uses (≈8 ms on Orin, ≈6 ms on Thor). Kernel
launch latency, memory contention with the vocoder and thermal limits are not modelled and
only push the figures up.

Two sets of inputs: the study's own (``STUDY_INPUTS``: 1.2 GB talker + 2.4 GB predictor,
bf16) to reproduce its table, and the byte counts of :mod:`vllm_omni.models` for any model
size and weight format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_omni.models import FrameBytes, frame_breakdown, get_model
from vllm_omni.models.counts import check_format

XEON_HOST_MS = 4.0  # study §3/§4: host-side runner work per step on the Xeon host
FRAME_MS = 80.0  # 12.5 Hz codec


@dataclass(frozen=True)
class Device:
    """A device as data: datasheet bandwidth and host speed relative to the Xeon host."""

    key: str
    name: str
    bandwidth_gbs: float  # GB/s, 1 GB = 1e9 B
    host_scale: float  # single-core slowdown vs the Xeon host (host work = 4 ms x scale)
    sm_count: int | None = None
    source: str = ""

    @property
    def host_ms(self) -> float:
        return XEON_HOST_MS * self.host_scale


_STUDY_TABLE = "study §4 (datasheet bandwidth; host work as used in the study's table)"

DEVICES: dict[str, Device] = {
    d.key: d
    for d in (
        Device("h200", "H200", 4800.0, 1.0, 132, _STUDY_TABLE + "; host is the Xeon itself"),
        Device("orin_agx_64g", "Jetson AGX Orin 64 GB", 204.8, 2.0, 16, _STUDY_TABLE),
        Device("orin_nx_16g", "Jetson Orin NX 16 GB", 102.4, 2.0, 8, _STUDY_TABLE),
        Device("thor", "Jetson Thor", 273.0, 1.5, 20, _STUDY_TABLE),
    )
}

# The study's §4 inputs, transcribed: 0.6B bf16 talker 1.2 GB, 15 predictor passes 2.4 GB.
STUDY_INPUTS = {"talker_bytes": 1.2e9, "predictor_bytes": 2.4e9, "other_bytes": 0.0}


def get_device(key: str) -> Device:
    """A device by key; unknown keys raise ValueError listing the valid ones."""
    try:
        return DEVICES[key]
    except KeyError:
        raise ValueError(f"unknown device {key!r}; valid: {', '.join(DEVICES)}") from None


def custom_device(bandwidth_gbs: float, host_ms: float = XEON_HOST_MS, name: str = "custom") -> Device:
    """A device from a bandwidth (GB/s, > 0) and host work per frame (ms, >= 0)."""
    if not isinstance(bandwidth_gbs, (int, float)) or not 0 < bandwidth_gbs < math.inf:
        raise ValueError(f"bandwidth must be a positive, finite number of GB/s, got {bandwidth_gbs!r}; "
                         f"or use a known device: {', '.join(DEVICES)}")
    if not isinstance(host_ms, (int, float)) or not 0 <= host_ms < math.inf:
        raise ValueError(f"host work must be a finite number of ms, zero or more, got {host_ms!r}")
    return Device(name.lower().replace(" ", "_"), name, float(bandwidth_gbs), host_ms / XEON_HOST_MS,
                  None, "given on the command line")


@dataclass(frozen=True)
class Projection:
    """One device's projected frame time from one set of byte inputs."""

    device: Device
    talker_bytes: float
    predictor_bytes: float
    other_bytes: float  # 1.7B small_to_mtp_projection; 0 otherwise

    @property
    def total_bytes(self) -> float:
        return self.talker_bytes + self.predictor_bytes + self.other_bytes

    @property
    def streaming_ms(self) -> float:
        return self.total_bytes / (self.device.bandwidth_gbs * 1e9) * 1e3

    @property
    def host_ms(self) -> float:
        return self.device.host_ms

    @property
    def ms_per_frame(self) -> float:
        return self.streaming_ms + self.host_ms

    @property
    def rtf(self) -> float:
        return self.ms_per_frame / FRAME_MS

    @property
    def realtime_bandwidth_gbs(self) -> float:
        """Bandwidth needed for the streaming term alone to fill the 80 ms frame."""
        return self.total_bytes / (FRAME_MS / 1e3) / 1e9


def _device(device: Device | str) -> Device:
    return device if isinstance(device, Device) else get_device(device)


def project_bytes(device: Device | str, talker_bytes: float, predictor_bytes: float, other_bytes: float = 0.0) -> Projection:
    for label, value in (("talker", talker_bytes), ("predictor", predictor_bytes), ("other", other_bytes)):
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{label} bytes must be zero or more, got {value!r}")
    return Projection(_device(device), float(talker_bytes), float(predictor_bytes), float(other_bytes))


def project_study_inputs(device: Device | str) -> Projection:
    """The study's own inputs (3.6 GB per frame): reproduces its §4 table."""
    return project_bytes(device, **STUDY_INPUTS)


def spec_bytes(model: str = "0.6B", fmt: str = "bf16") -> FrameBytes:
    return frame_breakdown(get_model(model), check_format(fmt))


def project_spec(device: Device | str, model: str = "0.6B", fmt: str = "bf16") -> Projection:
    """Bytes per frame from the model spec, for any size and weight format."""
    b = spec_bytes(model, fmt)
    return project_bytes(device, b.talker, b.predictor, b.projection)
