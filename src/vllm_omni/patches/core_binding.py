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

Engines without a stage, and engines whose ``VLLM_CPU_OMP_THREADS_BIND`` is set to
anything but ``auto``, keep vLLM's behaviour. In-process engines (the ``uni`` executor)
never bind at all in vLLM, so the patch has nothing to do for them.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ._base import Patch, PatchRefused, Target, assigns_attribute, function_of, reads_attribute, source_tree

logger = logging.getLogger("vllm_omni.patches.core_binding")

CONFIG_KEY = "vllm_omni"
STAGES = ("talker", "code2wav")
_INIT = Target("vllm.utils.ompmultiprocessing", "OMPProcessManager", "__init__")
_PARSE = "_parse_omp_threads_bind_env"
_CONFIGURE = "configure_omp_envs"


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


class CoreBindingPatch(Patch):
    name = "core_binding"
    summary = "engines tagged with a stage bind their workers to that stage's cores"
    targets = (_INIT,)

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

    def build(self, originals):
        original = originals[_INIT.qualname]

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

        return {_INIT.qualname: __init__}
