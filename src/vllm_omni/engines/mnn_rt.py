"""MNN (CPU backend) running the predictor pass converted from the ONNX export.

Conversion calls MNN's converter through its native module (``_tools.mnnconvert``), never
the ``mnnconvert``/``mnnquant`` console scripts: those import ``MNN.tools.utils.log``, which
pip-installs a logging SDK into whatever ``pip`` is on PATH and sends usage data.

Formats (the converter's weight quantization):

- ``fp32``: plain conversion; run with ``precision=high`` (fp32 arithmetic);
- ``int8``: ``--weightQuantBits 8`` (per output channel);
- ``int4``: ``--weightQuantBits 4 --weightQuantBlock 32`` (blocks of 32).

Both quantized forms are the converter's default, which in MNN 3.6.1 is asymmetric: a zero
point beside each scale (``weightQuantAsymmetric`` defaults to true, whatever its help says).

Quantized models run in MNN's low memory mode: MNN then keeps the weights in their low-bit
form and quantizes activations at run time (in the normal mode it dequantizes the weights to
fp32 at load, saving only file size). The Python binding reads the mode only as an integer
(``MEMORY_MODES``) and ignores a name such as ``"low"`` without a word, which is how the
runs before this was fixed came to time the normal mode. Threads: ``numThread = threads``.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engines.common import check_format, check_threads, dist_versions, file_bytes, missing

NAME = "MNN"
INT4_BLOCK = 32
MEMORY_MODES = {"normal": 0, "high": 1, "low": 2}  # MNN's BackendConfig::MemoryMode, as the binding reads it
SUPPORTED = {"fp32": None, "int8": None, "int4": None}
CONVERT_FLAGS = {"fp32": [], "int8": ["--weightQuantBits", "8"],
                 "int4": ["--weightQuantBits", "4", "--weightQuantBlock", str(INT4_BLOCK)]}


def unavailable() -> str | None:
    return missing("MNN", "_tools", "onnx", "onnxscript")


def versions() -> dict[str, str | None]:
    return dist_versions("mnn")


def convert(onnx_path: Path, out: Path, fmt: str) -> None:
    """ONNX -> .mnn with the converter's native entry point; raises when no file appears."""
    import _tools

    from vllm_omni.engines.common import captured_output

    args = ["mnnconvert", "-f", "ONNX", "--modelFile", str(onnx_path), "--MNNModel", str(out),
            "--bizCode", "vllm_omni", *CONVERT_FLAGS[fmt]]
    with captured_output() as log:
        _tools.mnnconvert(args)
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"MNN converter wrote no model for {' '.join(args[1:])}: {''.join(log)[-1000:]}")


def model_file(weights, fmt: str, workdir: str | Path, position: int) -> Path:
    from vllm_omni.engines.export import export_onnx

    base = export_onnx(weights, workdir, position)
    out = base.with_name(base.stem + f"-mnn-{fmt}.mnn")
    if not out.exists():
        tmp = out.with_suffix(".tmp.mnn")
        convert(base, tmp, fmt)
        tmp.replace(out)
    return out


class MnnRunner:
    def __init__(self, path: Path, fmt: str, threads: int, inputs):
        import MNN
        import MNN.expr as F
        import MNN.nn as nn

        from vllm_omni.engines.export import INPUT_NAMES, OUTPUT_NAMES

        memory = "normal" if fmt == "fp32" else "low"
        config = {"backend": "CPU", "precision": "high", "numThread": threads, "memory": MEMORY_MODES[memory]}
        self.runtime = nn.create_runtime_manager((config,))
        self.module = nn.load_module_from_file(str(path), list(INPUT_NAMES), list(OUTPUT_NAMES),
                                               runtime_manager=self.runtime)
        self.inputs = [F.const(t.contiguous().numpy(), list(t.shape), F.NCHW) for t in inputs]
        self.model_bytes = file_bytes(path)
        shown = {**config, "memory": f"{memory} ({config['memory']})"}
        self.settings = ", ".join(f"{k}={v}" for k, v in shown.items()) + f", MNN {MNN.version()}"

    def run_once(self) -> None:
        out = self.module.forward(self.inputs)
        out[0].read()  # waits for the result: forward may return before the backend finishes

    def logits(self):
        return self.module.forward(self.inputs)[0].read().copy()


def prepare(weights, *, fmt: str, threads: int, workdir: str | Path, position: int) -> MnnRunner:
    check_format(fmt, SUPPORTED, NAME)
    check_threads(threads)
    from vllm_omni.engines.export import example_inputs

    return MnnRunner(model_file(weights, fmt, workdir, position), fmt, threads, example_inputs(weights, position))
