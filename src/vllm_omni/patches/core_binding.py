"""Core binding: engines of different stages on one socket get disjoint cores.

What vLLM's CPU backend does: with ``VLLM_CPU_OMP_THREADS_BIND=auto`` (the default,
``vllm/envs.py:894``) each engine's ``OMPProcessManager`` picks the cores of NUMA node
``local_rank`` minus the ones it reserves for its scheduler process
(vllm-cpu 0.32.0, ``vllm/utils/ompmultiprocessing.py:129-151`` and ``:229-296``), and
binds its worker to them through OpenMP environment variables set around the worker's
spawn (``:70-120``; ``vllm/v1/executor/multiproc_executor.py:189-205``). The choice never
looks at other engines, so two engines on one socket bind their workers to the *same*
cores.

What the patch does: it wraps ``OMPProcessManager.__init__``. When the engine's config
names a stage, through ``additional_config={"vllm_omni": {"stage": "talker"}}`` (or
``"code2wav"``, or explicit ``"cpu_cores": "0-3"``), the worker lists are replaced by that
stage's share of the cores vLLM would have used:

- from the hardware profile (:func:`vllm_omni.hw_emulation.stage_cores`) when the profile
  is a CPU profile that fits on the cores this process may use,
- otherwise an even split between the stages (the first stage gets the odd core).

Engines without a ``vllm_omni`` block (neither a stage nor ``cpu_cores``), and engines whose
``VLLM_CPU_OMP_THREADS_BIND`` is set to anything but ``auto``, keep vLLM's behaviour.

In-process engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor) are never
bound by vLLM: ``UniProcExecutor`` builds its worker in the calling thread and runs every step
there (``vllm/v1/executor/uniproc_executor.py:52-75`` and ``:90-117``). For them the patch also
wraps ``CPUWorker.__init__`` and binds *the thread that builds the engine* to the stage's
share of the process's cores (same policy: the hardware profile, else an even split):

- ``os.sched_setaffinity(0, cores)`` on Linux changes the calling thread only;
- its OpenMP thread count is set to the number of those cores (``omp_set_num_threads``,
  reached through ``torch._C.set_num_threads``, is a per-thread setting in libgomp; torch
  initialises a thread's count lazily from the last count set anywhere, so the binding
  triggers that initialisation first);
- libgomp gives every thread that opens a parallel region its own team of worker threads,
  created on its first parallel region with more than one thread, and a new thread inherits
  the affinity of the thread that creates it. So the team of a thread bound *before* its
  first parallel region runs on the stage's cores, and two stages in two threads use
  disjoint cores -- torch ops, vLLM's CPU kernels and this project's native kernels alike,
  since torch and the native library share torch's ``libgomp``.

What it cannot do: re-bind a team that already exists. A thread that ran a multi-threaded
parallel region before it was bound (typically the main thread after some torch work)
keeps worker threads on its old cores; only the thread itself moves. And two stages driven
from one thread share that thread's single team, so they cannot be separated at all; the
patch then leaves the second engine on the first stage's cores and says so. :func:`stage_thread` gives each
stage a fresh thread that is bound before it runs anything: build and drive the stage's
engine (or any other stage work, such as a vocoder) through it.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import inspect
import logging
import os
import threading
from typing import Any

from ._base import Patch, PatchRefused, Target, assigns_attribute, function_of, reads_attribute, source_tree

logger = logging.getLogger("vllm_omni.patches.core_binding")

CONFIG_KEY = "vllm_omni"
STAGES = ("talker", "code2wav")
_INIT = Target("vllm.utils.ompmultiprocessing", "OMPProcessManager", "__init__")
_WORKER_INIT = Target("vllm.v1.worker.cpu_worker", "CPUWorker", "__init__")
_PARSE = "_parse_omp_threads_bind_env"
_CONFIGURE = "configure_omp_envs"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# Executors that run each worker in a process of its own (bound through OMPProcessManager).
DEDICATED_WORKER_EXECUTORS = ("mp", "ray")


def stage_request(vllm_config) -> dict[str, Any] | None:
    """The ``additional_config["vllm_omni"]`` block of an engine, validated; None if absent."""
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict) or CONFIG_KEY not in extra:
        return None
    block = extra[CONFIG_KEY]
    if not isinstance(block, dict):
        raise ValueError(f'additional_config["{CONFIG_KEY}"] must be a dict, got {type(block).__name__}')
    unknown = sorted(set(block) - {"stage", "cpu_cores"})
    if unknown:
        raise ValueError(f'additional_config["{CONFIG_KEY}"]: unknown key(s) {", ".join(unknown)}; valid: stage, cpu_cores')
    stage = block.get("stage")
    if stage is not None and stage not in STAGES:
        raise ValueError(f'additional_config["{CONFIG_KEY}"]["stage"]={stage!r}; valid: {", ".join(STAGES)}')
    cores = block.get("cpu_cores")
    if cores is not None:
        cores = parse_cores(cores)
    if stage is None and cores is None:
        return None
    return {"stage": stage, "cpu_cores": cores}


def parse_cores(value: Any) -> list[int]:
    """``"0-3,6"`` or ``[0, 1, 2, 3, 6]`` -> sorted unique ints; anything else raises ValueError."""
    if isinstance(value, str):
        out: list[int] = []
        try:
            for part in value.split(","):
                part = part.strip()
                if "-" in part:
                    a, b = (int(x) for x in part.split("-", 1))
                    if b < a:
                        raise ValueError
                    out.extend(range(a, b + 1))
                else:
                    out.append(int(part))
        except ValueError:
            raise ValueError(f"cpu_cores {value!r} is not a CPU list like '0-3,6'") from None
    elif isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        out = list(value)
    else:
        raise ValueError(f"cpu_cores must be a CPU list string or a list of ints, got {value!r}")
    if not out or min(out) < 0:
        raise ValueError(f"cpu_cores {value!r} must name at least one non-negative CPU id")
    return sorted(set(out))


def even_split(pool: list[int], stage: str) -> list[int]:
    """Stage ``stage``'s share of ``pool`` when the stages split it evenly (first stage gets the odd one)."""
    n, k = len(pool), len(STAGES)
    if n < k:
        raise ValueError(f"{n} usable core(s) cannot be split between {k} stages")
    i = STAGES.index(stage)
    base, extra = divmod(n, k)
    start = i * base + min(i, extra)
    return pool[start:start + base + (1 if i < extra else 0)]


def profile_split(pool: list[int], stage: str) -> tuple[list[int], str] | None:
    """The hardware profile's share for ``stage``, mapped onto ``pool``; None if no profile fits.

    The only coupling to :mod:`vllm_omni.hw_emulation`: its ``deploy_profile`` and
    ``stage_cores`` (core indices 0..cpu_cores-1 per stage).
    """
    try:
        from vllm_omni import hw_emulation

        profile = hw_emulation.deploy_profile("auto", cuda=None)
        indices = hw_emulation.stage_cores(profile).get(stage)
    except ValueError as exc:  # a VLLM_OMNI_HW_PROFILE that does not parse: said, not swallowed
        logger.warning("%s; binding cores by an even split instead", exc)
        return None
    except Exception as exc:  # noqa: BLE001 - no usable profile: fall back to the even split
        logger.debug("no hardware profile for core binding (%s)", exc)
        return None
    if not indices or max(indices) >= len(pool):
        return None
    return [pool[i] for i in indices], f"hardware profile {profile.name}"


def stage_cores(pool: list[int], request: dict[str, Any]) -> tuple[list[int], str]:
    """(cores, where they came from) for one engine's stage request."""
    if request["cpu_cores"] is not None:
        missing = sorted(set(request["cpu_cores"]) - set(pool))
        if missing:
            raise ValueError(f"cpu_cores {request['cpu_cores']} include CPU(s) {missing} that vLLM may not use "
                             f"here; usable: {pool}")
        return request["cpu_cores"], "explicit cpu_cores"
    found = profile_split(pool, request["stage"])
    if found is not None:
        return found
    return even_split(pool, request["stage"]), f"even split of {len(pool)} cores between {', '.join(STAGES)}"


def _rank_lists(cores: list[int], world: int, reserve: int) -> tuple[list[list[int]], list[int]]:
    """Split a stage's cores between its local ranks, reserving like vLLM does when there is room."""
    if len(cores) < world:
        raise ValueError(f"{len(cores)} core(s) for {world} local worker(s)")
    reserved: list[int] = []
    if len(cores) > reserve > 0:
        reserved, cores = cores[-reserve:], cores[:-reserve]
    per, extra = divmod(len(cores), world)
    lists, start = [], 0
    for r in range(world):
        n = per + (1 if r < extra else 0)
        lists.append(cores[start:start + n])
        start += n
    return lists, reserved


# --- in-process engines: bind the thread that builds and drives the stage ------------------------

_pool: list[int] | None = None
_pool_lock = threading.Lock()
_tls = threading.local()  # .binding = (stage or None, tuple of cores) for a thread this module bound


def process_pool() -> list[int]:
    """The cores in-process stages share: one logical CPU per physical core on the first
    visible NUMA node among the CPUs this process may use, read once per process (before a
    stage thread narrows its own affinity), as vLLM's auto binding picks a node's cores."""
    global _pool
    with _pool_lock:
        if _pool is None:
            import vllm.utils.cpu_resource_utils as cr

            cpus = cr.get_allowed_cpu_list()
            nodes = [n for n in cr.get_visible_memory_node() if any(c.numa_node == n for c in cpus)]
            if nodes:
                cpus = [c for c in cpus if c.numa_node == nodes[0]]
            first_of_core: dict[int, int] = {}
            for c in sorted(cpus, key=lambda c: c.id):
                first_of_core.setdefault(c.physical_core, c.id)
            _pool = sorted(first_of_core.values()) or sorted(os.sched_getaffinity(0))
        return list(_pool)


def reset_process_pool() -> None:
    """Forget the cached pool (tests)."""
    global _pool
    with _pool_lock:
        _pool = None


def thread_binding() -> tuple[str | None, tuple[int, ...]] | None:
    """``(stage, cores)`` when this module bound the calling thread, else None."""
    return getattr(_tls, "binding", None)


def _thread_request(stage: str | None, cpu_cores: Any) -> dict[str, Any]:
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage {stage!r}; valid: {', '.join(STAGES)}")
    request = {"stage": stage, "cpu_cores": None if cpu_cores is None else parse_cores(cpu_cores)}
    if request["stage"] is None and request["cpu_cores"] is None:
        raise ValueError("name a stage or cpu_cores")
    return request


def bind_current_thread(stage: str | None = None, *, cpu_cores: Any = None) -> tuple[list[int], str]:
    """Bind the calling thread to a stage's cores and give it one OpenMP thread per core.

    ``stage`` is ``"talker"`` or ``"code2wav"`` (its share of :func:`process_pool`, from the
    hardware profile or an even split), or ``cpu_cores`` names the cores. Returns
    ``(cores, where they came from)``. Call it before the thread runs any multi-threaded
    torch or native work: an OpenMP team that already exists keeps its old affinity.
    """
    request = _thread_request(stage, cpu_cores)
    cores, source = stage_cores(process_pool(), request)
    import torch

    os.sched_setaffinity(0, cores)
    # torch initialises a thread's OpenMP thread count lazily, on its first use, from the last
    # count set in any thread: trigger that first, so another thread's later setting cannot
    # replace ours; then set this thread's own count (omp_set_num_threads is per thread).
    torch.get_num_threads()
    torch._C.set_num_threads(len(cores))
    _tls.binding = (stage, tuple(cores))
    logger.info("core binding: thread %s (%d) bound to cores %s for stage %s (%s; %d OpenMP thread(s)) "
                "(vllm_omni patch core_binding)", threading.current_thread().name, threading.get_native_id(),
                cores, stage or "-", source, len(cores))
    return cores, source


def stage_thread(stage: str | None = None, *, cpu_cores: Any = None) -> concurrent.futures.ThreadPoolExecutor:
    """A one-thread executor whose thread is bound to ``stage``'s cores before it runs anything.

    Build an in-process stage engine and drive it through ``submit(...).result()``; the fresh
    thread's OpenMP team is created after the binding, so all of the stage's threads stay on
    its cores. Use it as a context manager (it is a ``ThreadPoolExecutor``).
    """
    request = _thread_request(stage, cpu_cores)
    stage_cores(process_pool(), request)  # fail here, in the caller, rather than in the new thread
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix=f"vllm_omni-{stage or 'stage'}",
        initializer=functools.partial(bind_current_thread, stage, cpu_cores=cpu_cores),
    )


def _bind_inprocess_engine(vllm_config) -> None:
    """What the wrapped ``CPUWorker.__init__`` does before vLLM's own code (see the module doc)."""
    request = stage_request(vllm_config)
    if request is None:
        return
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    if isinstance(backend, str) and backend in DEDICATED_WORKER_EXECUTORS:
        return  # a worker process of its own: bound by OMPProcessManager before its spawn
    if os.environ.get(BIND_ENV, "auto") != "auto":
        logger.info("core binding: %s is set explicitly; leaving this in-process engine unbound", BIND_ENV)
        return
    current = thread_binding()
    wanted, _ = stage_cores(process_pool(), request)
    if current is not None:
        if current[1] == tuple(wanted):
            logger.info("core binding: in-process engine for stage %s runs in thread %s, already bound to %s",
                        request["stage"] or "-", threading.current_thread().name, wanted)
            return
        logger.warning(
            "core binding: in-process engine for stage %s is built in thread %s, which is already bound to "
            "stage %s (cores %s); it is left there: two stages in one thread share one OpenMP team and cannot "
            "get disjoint cores. Build each stage in its own thread (vllm_omni.patches.core_binding.stage_thread)",
            request["stage"] or "-", threading.current_thread().name, current[0] or "-", list(current[1]),
        )
        return
    if threading.current_thread() is threading.main_thread():
        logger.warning(
            "core binding: in-process engine for stage %s is built in the main thread, which is now bound to "
            "cores %s for the rest of its life; OpenMP worker threads it already started keep their cores. "
            "Prefer vllm_omni.patches.core_binding.stage_thread", request["stage"] or "-", wanted)
    bind_current_thread(request["stage"], cpu_cores=request["cpu_cores"])


class CoreBindingPatch(Patch):
    name = "core_binding"
    summary = "engines tagged with a stage bind their workers (or, in-process, their thread) to that stage's cores"
    targets = (_INIT, _WORKER_INIT)

    def check(self, originals):
        from vllm.utils import ompmultiprocessing as omp

        cls = omp.OMPProcessManager
        for attr in (_PARSE, _CONFIGURE):
            if not callable(getattr(cls, attr, None)):
                raise PatchRefused(self.name, f"OMPProcessManager.{attr} is missing")
        parse = source_tree(self.name, getattr(cls, _PARSE))
        for attr in ("cpu_lists", "reserved_cpu_list", "auto_setup"):
            if not assigns_attribute(parse, attr, on="self"):
                raise PatchRefused(self.name, f"OMPProcessManager.{_PARSE} no longer sets self.{attr}")
        configure = source_tree(self.name, function_of(getattr(cls, _CONFIGURE)))
        if not reads_attribute(configure, "cpu_lists"):
            raise PatchRefused(self.name, f"OMPProcessManager.{_CONFIGURE} no longer binds from self.cpu_lists")
        import vllm.utils.cpu_resource_utils as cr

        for fn in ("get_allowed_cpu_list", "get_visible_memory_node"):
            if not callable(getattr(cr, fn, None)):
                raise PatchRefused(self.name, f"vllm.utils.cpu_resource_utils.{fn} is missing")
        # In-process half: the worker is built with the engine's config, and vLLM does not bind
        # in-process workers itself (if it starts to, binding the thread here would fight it).
        params = list(inspect.signature(function_of(originals[_WORKER_INIT.qualname])).parameters)
        if params[1:2] != ["vllm_config"]:
            raise PatchRefused(self.name, f"{_WORKER_INIT.qualname} no longer takes vllm_config first")
        try:
            from vllm.v1.executor.uniproc_executor import UniProcExecutor
        except ImportError as exc:
            raise PatchRefused(self.name, f"cannot import vllm.v1.executor.uniproc_executor ({exc})") from None
        init_exec = source_tree(self.name, UniProcExecutor._init_executor)
        names = {n.id for n in ast.walk(init_exec) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(init_exec) if isinstance(n, ast.Attribute)}
        if names & {"OMPProcessManager", "configure_omp_envs", "sched_setaffinity", "init_cpu_threads_env"}:
            raise PatchRefused(self.name, "UniProcExecutor now binds its worker's threads itself: "
                               "the in-process binding of this patch would fight it")

    def build(self, originals):
        original = originals[_INIT.qualname]
        worker_init = originals[_WORKER_INIT.qualname]

        @functools.wraps(original)
        def __init__(self, config, *args, **kwargs):
            original(self, config, *args, **kwargs)
            if not hasattr(self, "cpu_lists"):  # not a CPU platform: vLLM returned early
                return
            request = stage_request(config)
            if request is None:
                return
            if not getattr(self, "auto_setup", False):
                logger.info("core binding: VLLM_CPU_OMP_THREADS_BIND is set explicitly; leaving it for this engine")
                return
            pool = [core for ranks in self.cpu_lists for core in ranks] + list(self.reserved_cpu_list)
            pool = sorted(set(pool))
            cores, source = stage_cores(pool, request)
            lists, reserved = _rank_lists(cores, self.local_world_size, self.reserve_cpu_num)
            before = (self.cpu_lists, self.reserved_cpu_list)
            self.cpu_lists, self.reserved_cpu_list = lists, reserved
            logger.info(
                "core binding for stage %s: worker cores %s, reserved %s (%s; vLLM's choice was %s, reserved %s) "
                "(vllm_omni patch core_binding)",
                request["stage"] or "-", lists, reserved, source, before[0], before[1],
            )

        @functools.wraps(worker_init)
        def cpu_worker_init(self, vllm_config, *args, **kwargs):
            _bind_inprocess_engine(vllm_config)
            return worker_init(self, vllm_config, *args, **kwargs)

        return {_INIT.qualname: __init__, _WORKER_INIT.qualname: cpu_worker_init}
