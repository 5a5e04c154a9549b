"""ONNX Runtime (CPU execution provider) running the exported predictor pass.

Formats:

- ``fp32``: the ONNX export of ``vllm_omni.engines.export`` as is;
- ``int8``: ``onnxruntime.quantization.quantize_dynamic`` (int8 weights per output channel,
  activations quantized per tensor at run time: ``DynamicQuantizeLinear`` + ``MatMulInteger``);
- ``int4``: ``MatMulNBitsQuantizer`` (4-bit symmetric weights in blocks of 32, the
  ``com.microsoft.MatMulNBits`` contrib op, ``accuracy_level=4`` so activations are int8).

One session with ``intra_op_num_threads = threads`` and one inter-op thread.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engines.common import check_format, check_threads, dist_versions, file_bytes, missing

NAME = "ONNX Runtime"
INT4_BLOCK = 32
SUPPORTED = {"fp32": None, "int8": None, "int4": None}


def unavailable() -> str | None:
    return missing("onnxruntime", "onnx", "onnxscript")


def versions() -> dict[str, str | None]:
    return dist_versions("onnxruntime", "onnx", "onnxscript")


def model_file(weights, fmt: str, workdir: str | Path, position: int) -> Path:
    """The ONNX file for ``fmt`` under ``workdir`` (quantized from the fp32 export once)."""
    from vllm_omni.engines.export import export_onnx

    base = export_onnx(weights, workdir, position)
    if fmt == "fp32":
        return base
    out = base.with_name(base.stem + f"-ort-{fmt}.onnx")
    if out.exists():
        return out
    import logging

    tmp = out.with_suffix(".tmp.onnx")
    # quantize_dynamic advises pre-processing on the root logger; the 4-bit quantizer logs every node
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        _quantize(base, tmp, fmt)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    tmp.replace(out)
    return out


def _quantize(base: Path, tmp: Path, fmt: str) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if fmt == "int8":
        quantize_dynamic(str(base), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(str(base)), bits=4, block_size=INT4_BLOCK, is_symmetric=True,
                                 accuracy_level=4)
        q.process()
        q.model.save_model_to_file(str(tmp), use_external_data_format=False)


class OrtRunner:
    """One InferenceSession and fixed inputs; ``run_once`` is one pass."""

    def __init__(self, path: Path, threads: int, inputs):
        import onnxruntime as ort

        from vllm_omni.engines.export import INPUT_NAMES

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.feed = {n: t.contiguous().numpy() for n, t in zip(INPUT_NAMES, inputs)}
        self.model_bytes = file_bytes(path)
        self.settings = f"CPUExecutionProvider, intra_op_num_threads={threads}, inter_op_num_threads=1"

    def run_once(self) -> None:
        self.session.run(None, self.feed)

    def logits(self):
        """The first output (logits [1, vocab]) as a numpy array."""
        return self.session.run(["logits"], self.feed)[0]


def prepare(weights, *, fmt: str, threads: int, workdir: str | Path, position: int) -> OrtRunner:
    check_format(fmt, SUPPORTED, NAME)
    check_threads(threads)
    from vllm_omni.engines.export import example_inputs

    return OrtRunner(model_file(weights, fmt, workdir, position), threads, example_inputs(weights, position))
