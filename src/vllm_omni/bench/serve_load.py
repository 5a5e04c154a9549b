"""``vllm-omni-bench serve-load``: the speech server under load, measured the way a client feels it.

It starts ``qwen3-tts-edge serve`` as its own process on 127.0.0.1 (a free port), then for each
concurrency level keeps that many clients sending streamed requests back to back for
``--duration`` seconds (requests started before the end run to completion), cycling through a
fixed set of 12 prompts. Per level it records the time to first audio (p50, p90, p99), each
stream's RTF, the audio seconds served per wall second, the requests refused (429) and failed,
and the server's resident memory after the level and at its peak. Every accepted response is
checked: the body must end normally and hold the same number of samples as the same prompt
gave when it was sent alone (random weights rarely say EOS, so each request is cut at
``--frames`` frames by the server). Requests go only to 127.0.0.1, bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, folder_path, nonnegative_int, positive_int, positive_number, write_measured,
)

PROMPTS = (
    "Hello! This is the first of twelve test sentences.",
    "The weather today is clear, with a light wind from the west.",
    "Please remember to bring your ticket and a valid passport.",
    "Two cores can do more than most people expect of them.",
    "The train to the airport leaves every fifteen minutes.",
    "A short sentence.",
    "Numbers such as 42 and 1,024 are read out as words.",
    "Thank you for calling; your request has been received.",
    "The library closes at six o'clock on weekdays.",
    "Streaming audio starts playing before the sentence is finished.",
    "Every response is checked for its full length.",
    "This is the twelfth and last sentence of the set.",
)
SPEAKER, LANGUAGE = "ryan", "english"
SAMPLES_PER_FRAME, RATE = 1920, 24000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-load", help="the speech server under concurrent streamed requests on loopback")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None, help="a checkpoint directory (default: as speak)")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--threads", type=positive_int, default=None, help="the server's threads (default: all usable)")
    p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated client counts (default 1,2,4,8)")
    p.add_argument("--duration", type=positive_number, default=None,
                   help="seconds each level sends for (default 40; quick 3)")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per request (default 25; quick 3)")
    p.add_argument("--max-streams", type=positive_int, default=2, help="the server's --max-streams (default 2)")
    p.add_argument("--max-queue", type=nonnegative_int, default=1, help="the server's --max-queue (default 1)")
    p.add_argument("--soak", type=nonnegative_int, default=0,
                   help="after the levels, seconds with --max-streams clients (the server's maximum of streams), "
                        "sampling its resident memory every 5 s (default 0: none)")
    p.add_argument("--busy", default="idle",
                   help="other work running through the levels and the soak (vllm_omni.bench.competing_load): idle "
                        "(default), spin, torch or kinds joined by '+'")
    p.add_argument("--fixed-threads", action="store_true",
                   help="start the server with --fixed-threads (every usable core whatever else runs, as before)")
    p.add_argument("--cluster-replicas", type=positive_int, default=None,
                   help="serve through qwen3-tts-edge serve-cluster (Ray Serve) with this many replicas, each with "
                        "--max-streams and --max-queue, the cores shared out among them (default: one serve)")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint, short levels: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_name(p, "serving", "load-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_gib(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 2**20, 3)
    except OSError:
        return None
    return None


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a local Ray cluster's raylet, its workers and the replicas)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class _Server:
    """``qwen3-tts-edge serve`` in a child process on a free loopback port."""

    def __init__(self, model_dir: Path, weights: str, threads: int | None, frames: int, max_streams: int,
                 max_queue: int, fixed_threads: bool = False, replicas: int | None = None):
        self.port = _free_port()
        exe = Path(sys.executable).parent / "qwen3-tts-edge"
        self.replicas = replicas
        cmd = [str(exe), "serve" if replicas is None else "serve-cluster", "--model", str(model_dir), "--port", str(self.port), "--weights", weights,
               "--max-frames", str(frames), "--max-streams", str(max_streams), "--max-queue", str(max_queue), "--timeout", "600",
               "--served-model-name", "bench", "--log-level", "warning", "--max-positions", "512"]
        if threads:
            cmd += ["--threads", str(threads)]
        if fixed_threads:
            cmd.append("--fixed-threads")
        if replicas is not None:
            cmd += ["--replicas", str(replicas)]
        # its output goes to a file: a pipe nobody reads while the levels run could fill and stall the server
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        self.cmd = cmd

    def wait_ready(self, timeout_s: float = 600) -> float:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise BenchError(f"the server exited ({self.proc.returncode}): "
                                 f"{self.log.read().decode(errors='replace')[-2000:]}")
            self.log.seek(0)
            deployed = self.replicas is None or b"serving " in self.log.read()  # every replica up, not the first
            try:
                if deployed and httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BenchError(f"the server did not answer /health within {timeout_s:.0f} s")

    def memory_gib(self, field: str = "VmRSS") -> float | None:
        """The server's resident memory; a cluster's summed over all its processes (no peak: None)."""
        if self.replicas is None:
            return _rss_gib(self.proc.pid, field)
        if field != "VmRSS":
            return None
        values = [_rss_gib(p) for p in _descendants(self.proc.pid)]
        return round(sum(v for v in values if v is not None), 3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _request(base: str, prompt: int) -> dict:
    """One streamed pcm request: status, time to first audio, total time, samples, and whether it ended normally."""
    import httpx

    body = {"model": "bench", "input": PROMPTS[prompt], "voice": SPEAKER, "language": LANGUAGE,
            "response_format": "pcm", "stream": True, "seed": prompt}
    t0 = time.perf_counter()
    out = {"prompt": prompt, "status": None, "ttfa_s": None, "total_s": None, "samples": 0, "complete": False}
    try:
        with httpx.stream("POST", f"{base}/v1/audio/speech", json=body, timeout=600) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                r.read()
                return out
            n = 0
            for part in r.iter_raw():
                if part and out["ttfa_s"] is None:
                    out["ttfa_s"] = time.perf_counter() - t0
                n += len(part)
            out["samples"] = n // 2
            out["complete"] = n % 2 == 0
    except httpx.HTTPError as exc:  # a cut body: counted, never hidden
        out["error"] = type(exc).__name__
    out["total_s"] = time.perf_counter() - t0
    return out


def _level(base: str, clients: int, duration_s: float, start_prompt: int) -> tuple[list[dict], float]:
    """``clients`` threads sending back to back for ``duration_s``; (every request's record, wall seconds)."""
    results: list[dict] = []
    lock = threading.Lock()
    counter = [start_prompt]
    end = time.monotonic() + duration_s

    def client() -> None:
        while time.monotonic() < end:
            with lock:
                prompt = counter[0] % len(PROMPTS)
                counter[0] += 1
            res = _request(base, prompt)
            with lock:
                results.append(res)
            if res["status"] == 429:
                time.sleep(0.2)  # a refused client backs off a little before it tries again

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


def _soak(server: _Server, clients: int, seconds: float, expected: dict[int, int]) -> dict:
    """``clients`` at the server's maximum for ``seconds``, its resident memory sampled every 5 s."""
    samples: list[list[float]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not done.wait(0 if not samples else 5.0):
            samples.append([round(time.monotonic() - t0, 1), server.memory_gib()])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results, wall = _level(server.base, clients, seconds, start_prompt=0)
    done.set()
    sampler.join()
    samples.append([round(wall, 1), server.memory_gib()])
    t = _tally(results, expected)
    rss = [m for _, m in samples if m is not None]
    return {"clients": clients, "seconds": round(wall, 1), "requests": len(results), "accepted": len(t["ok"]),
            "refused": len(t["refused"]), "failed_or_incomplete": t["failed"], "memory_gib": samples,
            "memory_growth_gib": round(rss[-1] - rss[0], 3) if rss else None}


def _tally(results: list[dict], expected: dict[int, int]) -> dict:
    """Accepted (200), refused (429), and how many failed: another status, a cut body or a wrong length."""
    ok = [r for r in results if r["status"] == 200]
    whole = [r for r in ok if r["complete"] and "error" not in r and r["samples"] == expected[r["prompt"]]]
    refused = [r for r in results if r["status"] == 429]
    other = [r for r in results if r["status"] not in (200, 429)]
    return {"ok": ok, "refused": refused, "other": other, "incomplete": [r for r in ok if r not in whole],
            "failed": len(other) + len(ok) - len(whole)}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run(args: argparse.Namespace) -> int:
    from vllm_omni.bench import competing_load
    from vllm_omni.bench.speak import checkpoint_note, random_checkpoint
    from vllm_omni.tts.config import load_config

    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 or c > 64 for c in levels):
        raise BenchError(f"--concurrency must be client counts from 1 to 64 separated by commas, got {args.concurrency!r}")
    duration = args.duration or (3.0 if args.quick else 40.0)
    if duration > 600:
        raise BenchError(f"--duration must be at most 600 s, got {duration}")
    frames = args.frames or (3 if args.quick else 25)
    try:
        competing_load.parse(args.busy)
    except ValueError as exc:
        raise BenchError(f"--busy: {exc}") from None
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    cfg = load_config(model_dir)
    server = _Server(model_dir, args.weights, args.threads, frames, args.max_streams, args.max_queue,
                     args.fixed_threads, args.cluster_replicas)
    busy = contextlib.ExitStack()  # the competing load (--busy), through the levels and the soak
    try:
        ready_s = server.wait_ready()
        # each prompt alone first: the sample count every later response of it must have
        alone = [_request(server.base, i) for i in range(len(PROMPTS))]
        if any(r["status"] != 200 or not r["complete"] for r in alone):
            raise BenchError(f"a request sent alone failed: {[r for r in alone if r['status'] != 200][:1]}")
        expected = {r["prompt"]: r["samples"] for r in alone}
        rss_idle = server.memory_gib()
        rows, detail = [], {}
        busy.enter_context(competing_load.running(args.busy))
        for i, clients in enumerate(levels):
            results, wall = _level(server.base, clients, duration, start_prompt=i)
            t = _tally(results, expected)
            ok = t["ok"]
            ttfa = sorted(r["ttfa_s"] * 1e3 for r in ok if r["ttfa_s"] is not None)
            rtf = sorted(r["total_s"] / (r["samples"] / RATE) for r in ok if r["samples"])
            audio_s = sum(r["samples"] for r in ok) / RATE
            rows.append([clients, len(results), len(ok), len(t["refused"]), t["failed"],
                         _r(_pct(ttfa, 50)), _r(_pct(ttfa, 90)), _r(_pct(ttfa, 99)), _r(_pct(rtf, 50), 3),
                         _r(_pct(rtf, 90), 3), _r(max(rtf) if rtf else None, 3), _r(audio_s / wall, 3),
                         server.memory_gib()])
            detail[str(clients)] = {"wall_s": round(wall, 2), "incomplete": t["incomplete"][:5],
                                    "other_status": sorted({r["status"] for r in t["other"] if r["status"]})}
        soak = _soak(server, args.max_streams, args.soak, expected) if args.soak else None
        busy.close()
        peak = server.memory_gib("VmHWM")
    finally:
        busy.close()
        server.stop()
    write_measured(
        args,
        artifact_id=f"serving/load-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"The speech server under concurrent streamed requests ({cfg.family}, {args.weights}, loopback"
              + ("" if args.busy == "idle" else f", beside {competing_load.describe(args.busy)}")
              + (", --fixed-threads" if args.fixed_threads else "")
              + (f", {args.cluster_replicas} Ray Serve replicas" if args.cluster_replicas else "") + ")",
        columns=[
            {"name": "concurrency", "unit": None, "type": "number", "format": ".0f"},
            {"name": "requests", "unit": None, "type": "number", "format": ".0f"},
            {"name": "accepted", "unit": None, "type": "number", "format": ".0f"},
            {"name": "refused (429)", "unit": None, "type": "number", "format": ".0f"},
            {"name": "failed or incomplete", "unit": None, "type": "number", "format": ".0f"},
            {"name": "first audio p50", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "first audio p90", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "first audio p99", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF p50", "unit": None, "type": "number", "format": ".2f"},
            {"name": "RTF p90", "unit": None, "type": "number", "format": ".2f"},
            {"name": "RTF max", "unit": None, "type": "number", "format": ".2f"},
            {"name": "audio s per wall s", "unit": None, "type": "number", "format": ".2f"},
            {"name": "server memory after", "unit": "GiB", "type": "number", "format": ".2f"},
        ],
        rows=rows, model=cfg.family,
        weights=checkpoint_note(args, model_dir),
        quantization=args.weights, threads=args.threads or "all", source="vllm-omni-bench serve-load",
        compare={"tolerance": 0.25, "key_columns": ["concurrency"], "columns": ["first audio p50", "RTF p50"]},
        run={"prompts": list(PROMPTS), "speaker": SPEAKER, "language": LANGUAGE, "frames_per_request": frames,
             "duration_s": duration, "max_streams": args.max_streams, "max_queue": args.max_queue, "server_command": server.cmd[1:],
             "server_ready_s": round(ready_s, 2), "server_memory_idle_gib": rss_idle, "server_memory_peak_gib": peak,
             "expected_samples": expected, "levels": detail, "soak": soak,
             "other_work": {"load": args.busy, "what": competing_load.describe(args.busy)},
             "engine": f"up to {args.max_streams} requests spoken at once, each frame of all of them in one talker "
                       "call and one predictor call"
                       + (f", in each of {args.cluster_replicas} Ray Serve replicas (qwen3-tts-edge serve-cluster) "
                          "behind Ray's proxy" if args.cluster_replicas else ""),
             "cluster_replicas": args.cluster_replicas},
        notes=("Each level: that many clients send streamed pcm requests back to back for run.duration_s (a refused "
               "client waits 0.2 s before its next), cycling through the 12 prompts. First audio: from sending the "
               "request to the first body bytes. RTF: a request's wall time over its audio time, queueing included. "
               "Audio s per wall s: the audio of all accepted requests over the level's wall time. Failed or "
               "incomplete: accepted requests whose body was cut or whose sample count differs from the same prompt "
               "sent alone, plus any status other than 200 and 429. The server speaks up to --max-streams "
               f"{args.max_streams} requests at once, stepped together (--max-queue {args.max_queue} more may wait; "
               "beyond, 429). Random weights of the published shapes: "
               "every request is cut at run.frames_per_request frames. run.soak (with --soak): --max-streams clients "
               "(the configured maximum of streams) for that long after the levels, its resident memory sampled every 5 s "
               "(memory_gib: [seconds, GiB]) and its growth from the first sample to the last. run.other_work: what else ran "
               "through the levels and the soak (--busy, vllm_omni.bench.competing_load), started after the prompts "
               "were each sent alone.")
              + (" Through Ray Serve (run.cluster_replicas): the replicas share the usable cores equally, each with "
                 "the --max-streams and --max-queue above, and the server's memory is that of every process of the "
                 "command (Ray's own included), with no peak recorded." if args.cluster_replicas else "")
              + (" Quick mode: a shallow checkpoint and short levels, not a figure." if args.quick else ""),
    )
    return 0


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(float(x), digits)
