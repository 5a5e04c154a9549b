"""ExecuTorch with the XNNPACK delegate running the predictor pass.

The pass module of ``vllm_omni.engines.export`` goes through ``torch.export`` ->
``to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()])`` -> ``to_executorch()``
and is saved as a ``.pte`` program, which ``executorch.runtime`` loads and executes.

Formats (weights through torchao's ``quantize_`` before export, as ExecuTorch's LLM examples do):

- ``fp32``: no quantization;
- ``int8``: "8da8w", ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
  weight_granularity=PerAxis(0))``: int8 weights per output channel, activations quantized to
  int8 per token at run time;
- ``int4``: "8da4w", the same config with ``torch.int4`` weights in groups of 32.

Threads: XNNPACK runs on ExecuTorch's process-wide threadpool, resized to ``threads`` with
``portable_lib._unsafe_reset_threadpool`` (an experimental API; it is the only setting).
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engines.common import check_format, check_threads, dist_versions, file_bytes, missing

NAME = "ExecuTorch (XNNPACK)"
INT4_GROUP = 32
SUPPORTED = {"fp32": None, "int8": None, "int4": None}
SCHEMES = {"fp32": None, "int8": "8da8w", "int4": "8da4w"}


def unavailable() -> str | None:
    return missing("executorch", "torchao")


def versions() -> dict[str, str | None]:
    out = dist_versions("executorch", "torchao")
    try:
        from executorch import version

        out["executorch git"] = getattr(version, "git_version", None)
    except ImportError:
        pass
    return out


def _quantize(module, fmt: str) -> None:
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if fmt == "int8":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(INT4_GROUP))
    quantize_(module, cfg)


def program_file(weights, fmt: str, workdir: str | Path, position: int) -> Path:
    """The ``.pte`` program for ``fmt`` under ``workdir``, exported once."""
    import logging
    import warnings

    import torch

    from vllm_omni.engines.common import captured_output
    from vllm_omni.engines.export import PredictorPass, example_inputs, fingerprint

    path = Path(workdir) / f"predictor-pass-{fingerprint(weights, position)}-et-{fmt}.pte"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("torchao").setLevel(logging.ERROR)  # CUDA-kernel load notices on a CPU wheel
    log: list[str] = []
    try:
        # deprecation warnings and native notices of the export stack go to the buffer
        with captured_output() as log, warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
            from executorch.exir import to_edge_transform_and_lower

            module = PredictorPass(weights, position).eval()
            if fmt != "fp32":
                _quantize(module, fmt)
            ep = torch.export.export(module, example_inputs(weights, position), strict=False)
            program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as exc:  # noqa: BLE001 - keep the export stack's own message
        raise RuntimeError(f"ExecuTorch export failed: {type(exc).__name__}: {exc} {''.join(log)[-500:]}") from None
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(program.buffer)
    tmp.replace(path)
    return path


def delegation(weights, position: int) -> tuple[int, dict[str, int]]:
    """(XNNPACK partitions, {edge op: count} left outside them) of the fp32 pass after lowering.

    What is not delegated runs in ExecuTorch's portable kernels.
    """
    import collections
    import warnings

    import torch

    from vllm_omni.engines.common import captured_output
    from vllm_omni.engines.export import PredictorPass, example_inputs

    with captured_output(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        ep = torch.export.export(PredictorPass(weights, position).eval(), example_inputs(weights, position),
                                 strict=False)
        graph = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).exported_program().graph
    names = [n.target.__name__ for n in graph.nodes if n.op == "call_function" and n.target.__name__ != "getitem"]
    outside = collections.Counter(n for n in names if n != "executorch_call_delegate")
    return names.count("executorch_call_delegate"), dict(sorted(outside.items()))


class ExecuTorchRunner:
    def __init__(self, path: Path, threads: int, inputs):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the pybindings and thread-pool calls are marked experimental
            from executorch.extension.pybindings import portable_lib
            from executorch.runtime import Runtime

            portable_lib._unsafe_reset_threadpool(threads)
            self.threads = portable_lib._threadpool_get_thread_count()
        if self.threads != threads:
            raise RuntimeError(f"ExecuTorch threadpool has {self.threads} threads, asked for {threads}")
        self.program = Runtime.get().load_program(str(path))
        self.method = self.program.load_method("forward")
        self.inputs = [t.contiguous() for t in inputs]
        self.model_bytes = file_bytes(path)
        self.settings = f"XNNPACK delegate, threadpool {threads} threads"

    def run_once(self) -> None:
        self.method.execute(self.inputs)

    def logits(self):
        return self.method.execute(self.inputs)[0].numpy().copy()


def prepare(weights, *, fmt: str, threads: int, workdir: str | Path, position: int) -> ExecuTorchRunner:
    check_format(fmt, SUPPORTED, NAME)
    check_threads(threads)
    from vllm_omni.engines.export import example_inputs

    return ExecuTorchRunner(program_file(weights, fmt, workdir, position), threads, example_inputs(weights, position))
