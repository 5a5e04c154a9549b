"""ncnn (CPU, Vulkan off) running the predictor pass converted by pnnx.

``pnnx.export`` traces the pass module of ``vllm_omni.engines.export`` with
``torch.jit.trace`` and runs the ``pnnx`` binary, which writes an ncnn ``.param``/``.bin``
pair (fp32 weights: ``fp16=False``). The net runs with ``num_threads = threads`` and every
fp16/bf16 storage and arithmetic option off, so the fp32 row is fp32 throughout (ncnn turns
fp16 storage on by default where the CPU supports it).

Only ``fp32`` runs. ncnn's int8 path needs its ``ncnn2table`` (activation calibration) and
``ncnn2int8`` tools, which are built from the ncnn source tree and ship in neither the
``ncnn`` nor the ``pnnx`` wheel; ncnn has no 4-bit weight format for fully-connected layers.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engines.common import check_format, check_threads, dist_versions, file_bytes, missing

NAME = "ncnn"
SUPPORTED = {
    "fp32": None,
    "int8": "ncnn int8 needs the ncnn2table and ncnn2int8 tools (built from the ncnn source tree), "
            "which the ncnn and pnnx wheels do not ship",
    "int4": "ncnn has no 4-bit weight format for fully-connected layers",
}


def unavailable() -> str | None:
    return missing("ncnn", "pnnx")


def versions() -> dict[str, str | None]:
    return dist_versions("ncnn", "pnnx")


def model_files(weights, workdir: str | Path, position: int) -> tuple[Path, Path]:
    """The ncnn (.param, .bin) pair of the fp32 pass under ``workdir``, converted once."""
    import os
    import warnings

    import torch

    from vllm_omni.engines.common import captured_output
    from vllm_omni.engines.export import PredictorPass, example_inputs, fingerprint

    d = Path(workdir) / f"ncnn-{fingerprint(weights, position)}"
    param, binf = d / "pass.ncnn.param", d / "pass.ncnn.bin"
    if param.exists() and binf.exists():
        return param, binf
    d.mkdir(parents=True, exist_ok=True)
    import pnnx

    module = PredictorPass(weights, position).eval()
    cwd = os.getcwd()
    os.chdir(d)  # the pnnx binary runs in the working directory: keep anything it writes with the model
    log: list[str] = []
    try:
        with torch.no_grad(), captured_output() as log, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pnnx traces with torch.jit.trace, deprecated in torch
            pnnx.export(module, str(d / "pass.pt"), example_inputs(weights, position), fp16=False,
                        ncnnparam=str(param), ncnnbin=str(binf))
    except Exception as exc:  # noqa: BLE001 - pnnx raises plain Exceptions; keep its message
        raise RuntimeError(f"pnnx conversion failed: {exc} {''.join(log)[-1000:]}") from None
    finally:
        os.chdir(cwd)
    if not param.exists() or not binf.exists():
        raise RuntimeError(f"pnnx wrote no ncnn model: {''.join(log)[-1000:]}")
    return param, binf


def layer_types(param: str | Path) -> dict[str, int]:
    """{ncnn layer type: count} of a ``.param`` file (what pnnx made of the graph)."""
    import collections

    lines = Path(param).read_text().splitlines()
    if not lines or lines[0].strip() != "7767517":
        raise ValueError(f"{param} is not an ncnn .param file (no 7767517 magic line)")
    return dict(sorted(collections.Counter(line.split()[0] for line in lines[2:] if line.strip()).items()))


class NcnnRunner:
    def __init__(self, param: Path, binf: Path, threads: int, inputs):
        import ncnn

        self.ncnn = ncnn
        self.net = ncnn.Net()
        opt = self.net.opt
        opt.use_vulkan_compute = False
        opt.num_threads = threads
        for flag in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage",
                     "use_bf16_packed"):
            setattr(opt, flag, False)
        if self.net.load_param(str(param)) != 0 or self.net.load_model(str(binf)) != 0:
            raise RuntimeError(f"ncnn could not load {param}")
        self.arrays = [t.contiguous().numpy() for t in inputs]
        self.mats = [ncnn.Mat(a) for a in self.arrays]
        self.model_bytes = file_bytes(param, binf)
        self.settings = f"num_threads={threads}, vulkan off, fp16/bf16 storage and arithmetic off"

    def _extract(self):
        import numpy as np

        ex = self.net.create_extractor()
        for i, m in enumerate(self.mats):
            ex.input(f"in{i}", m)
        ret, out = ex.extract("out0")
        if ret != 0:
            raise RuntimeError(f"ncnn extract failed ({ret})")
        return np.array(out)

    def run_once(self) -> None:
        self._extract()

    def logits(self):
        return self._extract().reshape(1, -1)


def prepare(weights, *, fmt: str, threads: int, workdir: str | Path, position: int) -> NcnnRunner:
    check_format(fmt, SUPPORTED, NAME)
    check_threads(threads)
    from vllm_omni.engines.export import example_inputs

    param, binf = model_files(weights, workdir, position)
    return NcnnRunner(param, binf, threads, example_inputs(weights, position))
