"""The ``vllm-omni-bench`` console script."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from vllm_omni.bench.common import BenchError
from vllm_omni.cpu import clock, native
from vllm_omni.results import host_load, store
from vllm_omni.results.schema import ArtifactError

# Subcommand modules under vllm_omni.bench; each defines register(subparsers).
SUBCOMMAND_MODULES = (
    "env",
    "project",
    "gpu-matmul",
    "gpu-frame",
    "quality",
    "talker",
    "sampler",
    "frame",
    "bandwidth",
    "placement",
    "predictor",
    "gemv",
    "vllm-two-engines",
    "vllm-inprocess",
    "llamacpp",
    "engines",
    "compare",
    "audit",
    "targets",
    "hosts",
    "speak",
    "serve-load",
    "serve-formats",
    "batch-steps",
    "decoder-split",
    "busy-cores",
    "clone",
    "loop-analysis",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-omni-bench",
        description="Benchmarks and generators that write result artifacts (see docs/reference/cli.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's command stays on one line
        epilog=(f"Where artifacts go: --output DIR, else ${store.RESULTS_DIR_ENV}, else the checkout's\n"
                "results/ folder, whose files are committed and published. For a trial run, write\n"
                "elsewhere:\n\n"
                f'  {store.RESULTS_DIR_ENV}="$(mktemp -d)" vllm-omni-bench COMMAND ...\n\n'
                "Each command prints every file it wrote and which of the three sent it there."),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"vllm_omni.bench.{name.replace('-', '_')}").register(sub)
    return parser


def _results_folder_problem(args: argparse.Namespace) -> str | None:
    """Why this command could not write its artifacts, found before it measures anything."""
    if not hasattr(args, "output") or getattr(args, "no_write", False):
        return None
    folder = args.output if args.output is not None else store.default_results_dir()
    problem = store.folder_problem(folder)
    if problem is None:
        return None
    if args.output is not None:
        given = "--output"
    elif os.environ.get(store.RESULTS_DIR_ENV):
        given = f"${store.RESULTS_DIR_ENV}"
    else:
        given = "the checkout's results/"
    return f"results folder {folder} ({given}): {problem}; give a folder to write artifacts into"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = _results_folder_problem(args)
    if problem:
        print(f"vllm-omni-bench {args.command}: error: {problem}", file=sys.stderr)
        return 2
    host_load.mark()
    timed = getattr(args, "core_clock", False)  # a timed CPU run (set_defaults in its module)
    if timed or getattr(args, "native_kernels", False):
        try:
            native.q4_prefetch_groups()  # a bad setting stops the run before anything is built
            native.f32_rows_setting()
        except ValueError as exc:
            print(f"vllm-omni-bench {args.command}: error: {exc}", file=sys.stderr)
            return 2
    if timed:
        clock.mark()
    else:
        clock.clear()
    try:
        return int(args.func(args) or 0)
    except (BenchError, ArtifactError, native.NativeBuildError) as exc:
        print(f"vllm-omni-bench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed our stdout (`... | head`): stop as a Unix filter does, without a
        # traceback, and keep the interpreter from failing again as it flushes stdout on exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
