"""OpenVINO (CPU plugin) running the exported predictor pass.

The ONNX export is read with ``Core.read_model`` (the runtime's own ONNX frontend). The
``convert_model`` tool is not used: it sends usage telemetry when no consent file exists.

Formats:

- ``fp32``: the ONNX graph as is;
- ``int8`` / ``int4``: weight compression without NNCF (not installed): every MatMul whose
  weight is a constant gets that constant replaced by the decompression subgraph NNCF itself
  emits -- ``Constant(i8 | i4) -> Convert(f32) -> Multiply(scale)`` (int4: per group of 32,
  then ``Reshape``) feeding ``MatMul(transpose_b=True)`` -- which the CPU plugin runs as a
  fully-connected layer with compressed weights. int8 is symmetric per output channel, int4
  symmetric per group of 32 along the input dimension.

Compiled with ``INFERENCE_NUM_THREADS = threads``, one stream, the latency hint and
``INFERENCE_PRECISION_HINT = f32``: on CPUs with native bf16 (AVX512-BF16, AMX) the plugin
would otherwise run activations in bf16 by default.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engines.common import check_format, check_threads, dist_versions, file_bytes, missing

NAME = "OpenVINO"
INT4_GROUP = 32
SUPPORTED = {"fp32": None, "int8": None, "int4": None}


def unavailable() -> str | None:
    return missing("openvino", "onnx", "onnxscript")


def versions() -> dict[str, str | None]:
    out = dist_versions("openvino")
    try:
        import openvino

        out["openvino build"] = openvino.get_version()
    except ImportError:
        pass
    return out


def _quantize(w, fmt: str):
    """w [K, N] fp32 (ONNX MatMul layout) -> (quantized [N, K] or [N, K/g, g], scale) as numpy."""
    import numpy as np

    wt = np.ascontiguousarray(w.T.astype(np.float32))  # [N, K]
    if fmt == "int8":
        scale = np.maximum(np.abs(wt).max(axis=1, keepdims=True), 1e-12) / 127.0
        return np.clip(np.rint(wt / scale), -127, 127).astype(np.int8), scale.astype(np.float32)
    n, k = wt.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs the input dimension divisible by {INT4_GROUP}, got {k}")
    g = wt.reshape(n, k // INT4_GROUP, INT4_GROUP)
    scale = np.maximum(np.abs(g).max(axis=2, keepdims=True), 1e-12) / 7.0
    return np.clip(np.rint(g / scale), -8, 7).astype(np.int8), scale.astype(np.float32)


def _i4_constant(q):
    """An i4 Constant from int8 values in -8..7 (two per byte, low nibble first)."""
    import numpy as np
    import openvino as ov

    flat = (q.reshape(-1).astype(np.uint8) & 0x0F)
    packed = flat[0::2] | (flat[1::2] << 4)
    t = ov.Tensor(ov.Type.i4, ov.Shape(list(q.shape)))
    t.data[:] = packed
    return ov.op.Constant(t)


def compress_weights(model, fmt: str) -> int:
    """Rewrite every constant-weight MatMul of ``model`` in place; returns how many were rewritten."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        src = node.input_value(1).get_node()
        if src.get_type_name() != "Constant" or node.get_attributes().get("transpose_b"):
            continue
        w = src.get_data()
        if w.ndim != 2 or w.dtype != np.float32:
            continue
        q, scale = _quantize(w, fmt)
        if fmt == "int8":
            const = ops.constant(q, ov.Type.i8)
            deq = ops.multiply(ops.convert(const, ov.Type.f32), ops.constant(scale))
        else:
            deq = ops.multiply(ops.convert(_i4_constant(q), ov.Type.f32), ops.constant(scale))
            deq = ops.reshape(deq, ops.constant(np.array([q.shape[0], -1], dtype=np.int64)), special_zero=False)
        mm = ops.matmul(node.input_value(0), deq, transpose_a=bool(node.get_attributes().get("transpose_a")),
                        transpose_b=True)
        mm.set_friendly_name(node.get_friendly_name())
        for target in node.output(0).get_target_inputs():
            target.replace_source_output(mm.output(0))
        count += 1
    model.validate_nodes_and_infer_types()
    return count


def model_files(weights, fmt: str, workdir: str | Path, position: int) -> Path:
    """The OpenVINO IR (.xml + .bin) for ``fmt`` under ``workdir``, built once."""
    import openvino as ov

    from vllm_omni.engines.export import export_onnx

    base = export_onnx(weights, workdir, position)
    xml = base.with_name(base.stem + f"-ov-{fmt}.xml")
    if xml.exists():
        return xml
    model = ov.Core().read_model(str(base))
    if fmt != "fp32" and compress_weights(model, fmt) == 0:
        raise RuntimeError("no constant-weight MatMul found to compress")
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml


def compiled_layers(path: str | Path) -> dict[str, list[str]]:
    """{layer type: runtime precisions} of a model as the CPU plugin compiles it (f32 hint).

    Shows what the plugin made of the graph: fused layers (``RMS``) and whether a
    ``FullyConnected`` reads compressed weights (``i8``, ``i4``, ``u4``) or fp32.
    """
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    out: dict[str, set[str]] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        out.setdefault(info["layerType"].astype(str), set()).add(info["runtimePrecision"].astype(str))
    return {k: sorted(v) for k, v in sorted(out.items())}


class OpenVinoRunner:
    def __init__(self, xml: Path, threads: int, inputs):
        import openvino as ov

        from vllm_omni.engines.export import INPUT_NAMES

        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32"}
        self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.feed = {n: t.contiguous().numpy() for n, t in zip(INPUT_NAMES, inputs)}
        self.model_bytes = file_bytes(xml, xml.with_suffix(".bin"))
        self.settings = ", ".join(f"{k}={v}" for k, v in config.items())

    def run_once(self) -> None:
        self.request.infer(self.feed)

    def logits(self):
        return self.request.infer(self.feed)["logits"].copy()


def prepare(weights, *, fmt: str, threads: int, workdir: str | Path, position: int) -> OpenVinoRunner:
    check_format(fmt, SUPPORTED, NAME)
    check_threads(threads)
    from vllm_omni.engines.export import example_inputs

    return OpenVinoRunner(model_files(weights, fmt, workdir, position), threads, example_inputs(weights, position))
