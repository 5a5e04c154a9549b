"""Other work on the machine, fixed and documented, for the benchmarks and the test that run the
engine beside it (``vllm-omni-bench busy-cores``, ``serve-load --busy``, tests/test_busy_cores.py).

Each load is one or more child processes of this interpreter running
``python -m vllm_omni.bench.competing_load KIND``:

- ``spin``: a pure-Python busy loop, one core's worth of work that never waits;
- ``torch``: a PyTorch job, two 256 x 256 fp32 matrices multiplied in a loop on PyTorch's default
  thread count (all usable CPUs), so it brings an OpenMP team of its own, as a training or
  inference job beside the engine does; alone it keeps every core busy.

A load spec names them with ``+`` (``spin+spin``: two busy loops); ``idle`` is none.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import time
from typing import Iterator

KINDS = ("spin", "torch")
DESCRIPTIONS = {
    "idle": "nothing else running",
    "spin": "one busy loop (a pure-Python loop, one core's worth)",
    "torch": "a PyTorch matmul loop (256 x 256 fp32, PyTorch's default threads)",
    "spin+spin": "two busy loops",
}
READY_TIMEOUT_S = 60.0
SETTLE_S = 0.5  # after the last load says it is running, before the measured work starts


def parse(spec: str) -> list[str]:
    """The kinds of a load spec (``idle`` -> none); a ValueError names an unknown kind."""
    if spec == "idle":
        return []
    kinds = spec.split("+")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"a load is 'idle' or kinds joined by '+' from {', '.join(KINDS)}; got {spec!r}")
    return kinds


def describe(spec: str) -> str:
    return DESCRIPTIONS.get(spec) or " and ".join(DESCRIPTIONS[k] for k in parse(spec))


@contextlib.contextmanager
def running(spec: str) -> Iterator[list[subprocess.Popen]]:
    """The load ``spec`` running in child processes for the duration of the block (each has said it
    runs, then ``SETTLE_S`` passes); they are killed when the block ends, whatever happens in it."""
    procs: list[subprocess.Popen] = []
    try:
        for kind in parse(spec):
            procs.append(subprocess.Popen([sys.executable, "-m", "vllm_omni.bench.competing_load", kind],
                                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
        for p in procs:
            ready, _, _ = select.select([p.stdout], [], [], READY_TIMEOUT_S)
            if not ready or p.stdout.readline().strip() != b"running":
                raise RuntimeError(f"the competing load {spec!r} did not start (exit status {p.poll()})")
        if procs:
            time.sleep(SETTLE_S)
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def _spin() -> None:
    print("running", flush=True)
    while True:
        pass


def _torch() -> None:
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    a @ b
    print("running", flush=True)
    while True:
        a @ b


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in KINDS:
        print(f"usage: python -m vllm_omni.bench.competing_load {{{','.join(KINDS)}}}", file=sys.stderr)
        return 2
    {"spin": _spin, "torch": _torch}[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
