"""``vllm-omni-bench llamacpp``: llama.cpp and this project's kernels on the same weights, same run.

Both engines run the identical random weights (``vllm_omni.engines.gguf_export`` writes them
as GGUF), at the same thread count and KV position, in interleaved rounds (llama.cpp, ours,
llama.cpp, ours, ...) so that drift on a shared host hits both alike. Right before the rounds
of each format and thread count the host's read bandwidth is measured
(``vllm_omni.cpu.bandwidth``), and each engine's achieved bandwidth (weight bytes per pass /
median time) is reported as a fraction of it.

Parts (``--parts``):

- ``predictor``: one single-token pass (5 blocks, final norm, one head) at KV position 8
  (``bench.predictor.PASS_POSITION``); ours is ``FusedPredictor.pass_once``;
- ``talker``: one single-token talker step (28 blocks, final norm, codec head) at KV position
  256 (the cache length ``vllm-omni-bench talker`` starts from); ours is ``FusedTalker.step``
  with its position reset before every step;
- ``prefill``: the predictor's 2-token prefill (positions 0, 1; ours: the fused stack) and a
  talker prefill of N tokens (ours: the eager PyTorch reference, since the fused kernels only
  take one or two tokens at a time).

Formats: ``fp32`` (GGUF F32), ``fp16`` (F16; llama.cpp only, ours has no fp16 kernel),
``int8`` (Q8_0 vs our per-row int8), ``int4`` (Q4_0 vs our group-32 int4). llama.cpp keeps its
defaults: F16 KV cache and flash attention as it chooses (``--kv-type f32`` for an F32 cache).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path
from typing import Any, Callable

from vllm_omni.bench.common import (
    BenchError, add_output, add_suffix, cpu_threads, folder_path, median, nonnegative_int, parse_list, positive_int,
    thread_counts, time_calls, write_measured,
)
from vllm_omni.bench.predictor import PASS_POSITION
from vllm_omni.models import get_model

PARTS = ("predictor", "talker", "prefill")
FORMATS = ("fp32", "fp16", "int8", "int4")
OURS_FORMATS = ("fp32", "int8", "int4")
# eager-reference format paired with each llama.cpp format in the talker prefill (no fp16 there)
PREFILL_REFERENCE = {"fp32": "fp32", "fp16": "bf16", "int8": "int8", "int4": "int4"}
TALKER_POSITION = 256
PREFILL_TOKENS = 64
QUICK = {"predictor_layers": 1, "talker_layers": 2, "talker_position": 16, "prefill_tokens": 8}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("llamacpp", help="llama.cpp vs this project's kernels: same weights, threads and positions")
    p.add_argument("--parts", default=None,
                   help=f"comma-separated parts of {', '.join(PARTS)} (default: all; --quick: predictor)")
    p.add_argument("--formats", default=None,
                   help=f"comma-separated formats of {', '.join(FORMATS)} (default: all; --quick: int4)")
    p.add_argument("--threads", type=cpu_threads, default=None, help="threads (default: all usable cores)")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts measured in one run, e.g. 1,2")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="model size (random weights)")
    p.add_argument("--rounds", type=positive_int, default=None, help="interleaved rounds (default 5; --quick 1)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed calls per engine per round (default 10; --quick 3)")
    p.add_argument("--talker-position", type=nonnegative_int, default=None,
                   help=f"KV position of the timed talker step (default {TALKER_POSITION}; "
                        f"--quick {QUICK['talker_position']})")
    p.add_argument("--prefill-tokens", type=positive_int, default=None,
                   help=f"talker prefill length (default {PREFILL_TOKENS}; --quick {QUICK['prefill_tokens']})")
    p.add_argument("--kv-type", choices=("f16", "f32"), default="f16",
                   help="llama.cpp KV cache type (its default: f16)")
    p.add_argument("--workdir", type=folder_path, default=None, help="folder for the GGUF files (default: a temporary one)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK['predictor_layers']} predictor layer, a {QUICK['talker_layers']}-layer talker, "
                        "int4 only, few repetitions: for doctests, not for figures")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights")
    add_suffix(p, "each artifact's name, llamacpp-<part>-t<thread counts>[-<model>]")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def _choices(value: str | None, valid: tuple[str, ...], default: tuple[str, ...], what: str) -> list[str]:
    return list(default) if value is None else parse_list(value, valid, what)


# --- the engines, each as (set_threads, run_once) --------------------------------------------------

class _Engine:
    def __init__(self, set_threads: Callable[[int], None], run_once: Callable[[], None], nbytes: int | None,
                 close: Callable[[], None] | None = None):
        self.set_threads, self.run_once, self.nbytes, self._close = set_threads, run_once, nbytes, close

    def close(self) -> None:
        if self._close:
            self._close()


def _llama_single(gguf, threads: int, position: int, kv_type: str) -> _Engine:
    from vllm_omni.engines.llamacpp import LlamaCppRunner

    r = LlamaCppRunner(gguf, threads=threads, position=position, kv_type=kv_type)
    return _Engine(r.set_threads, r.run_once, r.bytes_per_pass, r.close)


def _ours_predictor_pass(weights, fmt: str, threads: int) -> _Engine:
    import torch

    from vllm_omni.cpu.predictor import FusedPredictor

    p = FusedPredictor(weights, fmt=fmt, threads=threads)
    x = torch.randn(1, weights.spec.predictor.hidden, generator=torch.Generator().manual_seed(1)) * 0.5
    return _Engine(p.set_threads, lambda: p.pass_once(x, position=PASS_POSITION, head=0), p.pass_bytes)


def _ours_talker_step(weights, fmt: str, threads: int, position: int) -> _Engine:
    from vllm_omni.cpu.fused_talker import FusedTalker

    t = FusedTalker(weights, fmt=fmt, threads=threads, max_positions=position + 8)
    t.prefill_random(position, seed=0)
    x = weights.codec_embedding[7].clone()

    def step() -> None:
        t.position = position
        t.step(x)

    return _Engine(t.set_threads, step, t.step_bytes)


def _llama_prefill(gguf, threads: int, tokens: int, kv_type: str) -> _Engine:
    from vllm_omni.engines.llamacpp import LlamaCppModel

    m = LlamaCppModel(gguf.path, threads=threads, n_ctx=max(64, tokens), kv_type=kv_type)
    ids = [(7 + 31 * i) % gguf.vocab for i in range(tokens)]

    def run_once() -> None:
        m.decode(ids, 0)
        m.truncate(0)

    return _Engine(m.set_threads, run_once, None, m.close)


def _ours_predictor_prefill(weights, fmt: str, threads: int) -> _Engine:
    import torch

    from vllm_omni.cpu.predictor import FusedPredictor

    p = FusedPredictor(weights, fmt=fmt, threads=threads)
    x = torch.randn(2, weights.spec.predictor.hidden, generator=torch.Generator().manual_seed(1)) * 0.5
    return _Engine(p.set_threads, lambda: p.native.forward(x, 0, p.heads[0]), None)


def _reference_talker_prefill(weights, fmt: str, tokens: int) -> _Engine:
    import torch

    from vllm_omni.cpu.reference import ReferenceTalker

    t = ReferenceTalker(weights, fmt=fmt, capacity=tokens)
    x = (weights.codec_embedding[:tokens].clone()).to(t.stack.dtype)

    def run_once() -> None:
        with torch.inference_mode():
            t.stack.clear()
            t.codec_head(t.stack.forward_last(x))

    return _Engine(torch.set_num_threads, run_once, None)


# --- timing ----------------------------------------------------------------------------------------

def _interleave(engines: dict[str, _Engine], threads: int, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Rounds of ``repeats`` timed calls per engine, alternating engines, after one warm-up each."""
    for e in engines.values():
        e.set_threads(threads)
        e.run_once()
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, e in engines.items():
            samples[name] += time_calls(e.run_once, repeats=repeats, warmup=0)
    return samples


def _fraction(nbytes: int | None, ms: float | None, gbps: float) -> float | None:
    if nbytes is None or ms is None:
        return None
    return round(nbytes / (ms * 1e-3) / 1e9 / gbps, 3)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a / b, 3)


def _ratio_by_round(a: list[float], b: list[float], rounds: int) -> float:
    """Median over rounds of a's median over b's in that round (``_interleave`` order: round by
    round, ``repeats`` calls each). The two engines of a round run seconds apart, so a change of
    the host's bandwidth between rounds moves both sides of each ratio alike."""
    ra, rb = len(a) // rounds, len(b) // rounds
    return round(median([median(a[i * ra:(i + 1) * ra]) / median(b[i * rb:(i + 1) * rb]) for i in range(rounds)]), 3)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


SINGLE_COLUMNS = [
    {"name": "case", "unit": None, "type": "text"},
    {"name": "format", "unit": None, "type": "text"},
    {"name": "gguf type", "unit": None, "type": "text"},
    {"name": "threads", "unit": None, "type": "number"},
    {"name": "llama.cpp median", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "llama.cpp min", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "ours median", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "ours min", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "llama.cpp / ours", "unit": None, "type": "number", "format": ".2f"},
    {"name": "llama.cpp / ours by round", "unit": None, "type": "number", "format": ".2f"},
    {"name": "llama.cpp bytes", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "ours bytes", "unit": "MB", "type": "number", "format": ".1f"},
    {"name": "read bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
    {"name": "llama.cpp bandwidth fraction", "unit": None, "type": "number", "format": ".2f"},
    {"name": "ours bandwidth fraction", "unit": None, "type": "number", "format": ".2f"},
]

PREFILL_COLUMNS = [
    {"name": "case", "unit": None, "type": "text"},
    {"name": "work", "unit": None, "type": "text"},
    {"name": "format", "unit": None, "type": "text"},
    {"name": "threads", "unit": None, "type": "number"},
    {"name": "llama.cpp median", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "ours", "unit": None, "type": "text"},
    {"name": "ours format", "unit": None, "type": "text"},
    {"name": "ours median", "unit": "ms", "type": "number", "format": ".2f"},
    {"name": "llama.cpp / ours", "unit": None, "type": "number", "format": ".2f"},
]


def _single_rows(part: str, fmts: list[str], counts: list[int], probe: Callable[[str, int, int], float],
                 build: Callable[[str, int], tuple[Any, _Engine | None]], rounds: int, repeats: int) -> list[list[Any]]:
    """Rows of one single-token part: per format, both engines built once and timed per thread count."""
    from vllm_omni.engines.gguf_export import gguf_type

    rows = []
    for fmt in fmts:
        llama, ours = build(fmt, max(counts))
        engines = {"llama.cpp": llama} | ({"ours": ours} if ours is not None else {})
        for t in counts:
            bw = probe(f"{part} {fmt} t{t}", t, (ours or llama).nbytes)
            s = _interleave(engines, t, rounds, repeats)
            l_med, o_med = median(s["llama.cpp"]), (median(s["ours"]) if ours else None)
            rows.append([
                f"{fmt} t{t}", fmt, gguf_type(fmt), t, _r(l_med), _r(min(s["llama.cpp"])), _r(o_med),
                _r(min(s["ours"])) if ours else None, _ratio(l_med, o_med),
                _ratio_by_round(s["llama.cpp"], s["ours"], rounds) if ours else None, round(llama.nbytes / 1e6, 2),
                round(ours.nbytes / 1e6, 2) if ours else None, round(bw, 2), _fraction(llama.nbytes, l_med, bw),
                _fraction(ours.nbytes, o_med, bw) if ours else None,
            ])
            print(f"{part:9s} {fmt} t={t}: llama.cpp {l_med:.2f} ms"
                  + (f", ours {o_med:.2f} ms, ratio {l_med / o_med:.2f}" if ours else ", ours n/a")
                  + f" (read bandwidth {bw:.1f} GB/s)")
        for e in engines.values():
            e.close()
        del engines, llama, ours
        gc.collect()
    return rows


def run(args: argparse.Namespace) -> int:
    from vllm_omni.engines import EngineUnsupported, llamacpp

    spec = get_model(args.model)
    parts = _choices(args.parts, PARTS, ("predictor",) if args.quick else PARTS, "parts")
    fmts = _choices(args.formats, FORMATS, ("int4",) if args.quick else FORMATS, "formats")
    counts = thread_counts(args)
    rounds = args.rounds or (1 if args.quick else 5)
    repeats = args.repeats or (3 if args.quick else 10)
    p_layers = QUICK["predictor_layers"] if args.quick else spec.predictor.layers
    t_layers = QUICK["talker_layers"] if args.quick else spec.talker.layers
    t_pos = args.talker_position if args.talker_position is not None else (
        QUICK["talker_position"] if args.quick else TALKER_POSITION)
    n_prefill = args.prefill_tokens or (QUICK["prefill_tokens"] if args.quick else PREFILL_TOKENS)
    why = llamacpp.unavailable()
    if why:
        raise BenchError(why)
    from vllm_omni.cpu.bandwidth import read_bandwidth_probes
    from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights
    from vllm_omni.engines.gguf_export import export_predictor, export_talker

    tmp = None
    workdir = args.workdir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vllm-omni-gguf-")
        workdir = Path(tmp.name)
    ver = llamacpp.versions()
    bandwidth: dict[str, dict[str, float]] = {}

    def probe(case: str, threads: int, nbytes: int) -> float:
        bw = read_bandwidth_probes(threads, quick=args.quick, working_set=nbytes)
        bandwidth[case] = {k: round(v, 2) for k, v in bw.items()}
        return bw["best"]
    need = set(parts)
    pw = random_predictor_weights(spec, seed=args.seed, layers=p_layers) if need & {"predictor", "prefill"} else None
    tw = random_talker_weights(spec, seed=args.seed, layers=t_layers) if need & {"talker", "prefill"} else None

    def gguf_predictor(fmt: str):
        return export_predictor(pw, llamacpp.gguf_path(workdir, "predictor", fmt, p_layers), fmt)

    def gguf_talker(fmt: str):
        return export_talker(tw, llamacpp.gguf_path(workdir, "talker", fmt, t_layers), fmt)

    def build_predictor(fmt: str, threads: int):
        ours = _ours_predictor_pass(pw, fmt, threads) if fmt in OURS_FORMATS else None
        return _llama_single(gguf_predictor(fmt), threads, PASS_POSITION, args.kv_type), ours

    def build_talker(fmt: str, threads: int):
        ours = _ours_talker_step(tw, fmt, threads, t_pos) if fmt in OURS_FORMATS else None
        return _llama_single(gguf_talker(fmt), threads, t_pos, args.kv_type), ours

    common = {
        "model": spec.name, "weights": f"random, seed {args.seed}, published shapes",
        "quantization": ",".join(fmts), "threads": ",".join(str(t) for t in counts),
        "builds": {"llama.cpp": ver.get("llama.cpp"), "llama_cpp_python": ver.get("llama_cpp_python"),
                   "llama.cpp build": ver.get("llama.cpp build")},
    }
    run_base = {
        "llama.cpp system_info": ver.get("llama.cpp system_info"),
        "llama.cpp kv_type": args.kv_type, "llama.cpp flash_attn": "auto (llama.cpp's default)",
        "llama.cpp use_extra_bufts": llamacpp.default_extra_buffers(),
        "rounds": rounds, "repeats_per_round": repeats,
    }
    tcs = "-".join(str(t) for t in counts)
    suffix = "".join(("" if args.model == "0.6B" else f"-{args.model.lower()}", f"-{args.suffix}" if args.suffix else "",
                      "-quick" if args.quick else ""))
    quick_note = (" Quick mode: shallow stacks and few repetitions, for doctests only, not a figure."
                  if args.quick else "")
    same_weights = ("Random weights of the published shapes, identical in both engines (written as GGUF by "
                    "vllm_omni.engines.gguf_export): speed does not depend on weight values. ")
    bw_note = ("Bandwidth fraction = weight bytes per call / median time / read bandwidth measured right before "
               "that row's rounds at the same thread count (best of a native wide-load probe and a torch sum streaming "
               "1 GiB, and the native probe re-reading a buffer of that call's weight bytes, ours where we run it); "
               "KV-cache reads are not counted (llama.cpp's cache is F16 by default; ours is fp32 with fp32 weights "
               "and fp16 with int8 and int4). ")

    ratio_note = ("'llama.cpp / ours' divides the two medians; 'by round' is the median over rounds of each "
                  "round's ratio, both engines timed seconds apart, which a change of the host's bandwidth during "
                  "a row does not tilt. ")

    def bw_of(part: str) -> dict[str, dict[str, float]]:
        return {k: v for k, v in bandwidth.items() if k.startswith(part + " ")}

    try:
        if "predictor" in parts:
            rows = _single_rows("predictor", fmts, counts, probe, build_predictor, rounds, repeats)
            write_measured(
                args, artifact_id=f"engines/llamacpp-predictor-t{tcs}{suffix}",
                title=(f"One code-predictor pass: llama.cpp vs the fused kernel ({args.model}, "
                       f"KV position {PASS_POSITION})"),
                columns=SINGLE_COLUMNS, rows=rows, source="vllm-omni-bench llamacpp (predictor)", **common,
                run={**run_base, "layers": p_layers, "kv_position": PASS_POSITION,
                     "read_bandwidth_gbps": bw_of("predictor")},
                notes=(same_weights + f"One single-token pass ({p_layers} blocks, final norm, one 2048-row head) at KV "
                       f"position {PASS_POSITION}, in interleaved rounds. Ours = FusedPredictor.pass_once. "
                       + bw_note + ratio_note + "fp16 runs in llama.cpp only." + quick_note),
            )
        if "talker" in parts:
            rows = _single_rows("talker", fmts, counts, probe, build_talker, rounds, repeats)
            write_measured(
                args, artifact_id=f"engines/llamacpp-talker-t{tcs}{suffix}",
                title=f"One talker step: llama.cpp vs the fused kernel ({args.model}, KV position {t_pos})",
                columns=SINGLE_COLUMNS, rows=rows, source="vllm-omni-bench llamacpp (talker)", **common,
                run={**run_base, "layers": t_layers, "kv_position": t_pos, "read_bandwidth_gbps": bw_of("talker")},
                notes=(same_weights + f"One single-token step ({t_layers} blocks, final norm, 3072-row codec head) at "
                       f"KV position {t_pos}, in interleaved rounds; ours = FusedTalker.step with the position reset "
                       "before each step (its cache holds random K/V, llama.cpp's a real prefill). "
                       + bw_note + ratio_note + "fp16 runs in llama.cpp only." + quick_note),
            )
        if "prefill" in parts:
            rows = []
            for fmt in fmts:
                engines = {"llama.cpp": _llama_single_prefill(gguf_predictor(fmt), max(counts), args.kv_type)}
                if fmt in OURS_FORMATS:
                    engines["ours"] = _ours_predictor_prefill(pw, fmt, max(counts))
                rows += _prefill_rows("predictor, 2 tokens", fmt, "fused kernel", fmt if "ours" in engines else None,
                                      engines, counts, rounds, repeats)
                ref_fmt = PREFILL_REFERENCE[fmt]
                engines = {"llama.cpp": _llama_prefill(gguf_talker(fmt), max(counts), n_prefill, args.kv_type),
                           "ours": _reference_talker_prefill(tw, ref_fmt, n_prefill)}
                rows += _prefill_rows(f"talker, {n_prefill} tokens", fmt, "eager PyTorch reference", ref_fmt,
                                      engines, counts, rounds, max(1, repeats // 3))
            write_measured(
                args, artifact_id=f"engines/llamacpp-prefill-t{tcs}{suffix}",
                title=f"Prefill: llama.cpp vs ours ({args.model})",
                columns=PREFILL_COLUMNS, rows=rows, source="vllm-omni-bench llamacpp (prefill)", **common,
                run={**run_base, "predictor_layers": p_layers, "talker_layers": t_layers,
                     "talker_prefill_tokens": n_prefill},
                notes=(same_weights + "Predictor: the 2-token prefill at positions 0 and 1 with one head (ours: the "
                       "fused stack). Talker: a prefill of N tokens at positions 0..N-1 with the codec head on the "
                       "last one (ours: the eager PyTorch reference, the only path of ours that takes more than two "
                       "tokens; its bf16 stands beside llama.cpp's F16, its int8 is torch quantize_dynamic, its "
                       "int4 _weight_int4pack_mm with bf16 activations). Talker rows use a third of the repeats."
                       + quick_note),
            )
    except EngineUnsupported as exc:
        raise BenchError(str(exc)) from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def _llama_single_prefill(gguf, threads: int, kv_type: str) -> _Engine:
    """llama.cpp decoding 2 tokens at positions 0 and 1 (the predictor's first pass of a frame)."""
    return _llama_prefill(gguf, threads, 2, kv_type)


def _prefill_rows(work: str, fmt: str, ours_name: str, ours_fmt: str | None, engines: dict[str, _Engine],
                  counts: list[int], rounds: int, repeats: int) -> list[list[Any]]:
    rows = []
    for t in counts:
        s = _interleave(engines, t, rounds, repeats)
        l_med = median(s["llama.cpp"])
        o_med = median(s["ours"]) if "ours" in s else None
        rows.append([f"{work.split(',')[0]} {fmt} t{t}", work, fmt, t, _r(l_med),
                     ours_name if o_med is not None else None, ours_fmt, _r(o_med), _ratio(l_med, o_med)])
        print(f"prefill   {work} {fmt} t={t}: llama.cpp {l_med:.2f} ms"
              + (f", ours {o_med:.2f} ms" if o_med is not None else ""))
    for e in engines.values():
        e.close()
    gc.collect()
    return rows
