"""Beyond one machine: the same engine and app as Ray Serve replicas (``qwen3-tts-edge serve-cluster``).

Why Ray Serve: it already does what a fleet of speech servers needs and this project should not
rewrite: one HTTP entry point (its proxy) in front of replicas placed on any machine of a Ray
cluster, each request sent to the less busy of two replicas sampled, streamed responses passed
through as they come, and replicas added or removed on load. Each replica here is one
``SpeechEngine`` with its own threads and batched steps, and the app of ``server.app`` around it,
built on the replica (``serve.ingress`` with a builder), so every endpoint, format and limit is
the single server's.

What a replica holds: up to ``max_streams`` requests spoken together and ``max_queue`` waiting,
which is also the most Ray sends it (``max_ongoing_requests``); requests beyond that wait in
Ray's proxy for a free place. With ``max_replicas`` the deployment autoscales between
``replicas`` and ``max_replicas`` on the requests each replica holds, waiting ones included,
aiming at ``max_streams`` per replica (Ray Serve's ``target_ongoing_requests``).

Not shared between replicas: saved voices (a Base checkpoint's ``--voices`` folder is one
server's), so ``serve-cluster`` refuses ``--voices``.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, Callable

DEPLOYMENT = "qwen3-tts-edge"


def replica_threads(threads: int | None, replicas: int, max_replicas: int | None) -> int:
    """A replica's threads: ``threads``, else this machine's usable cores shared out among the most replicas."""
    from vllm_omni.results.provenance import usable_cpus

    return threads if threads is not None else max(1, usable_cpus() // (max_replicas or replicas))


def deployment_options(replicas: int, max_replicas: int | None, threads: int, max_streams: int,
                       max_queue: int) -> dict[str, Any]:
    """``serve.deployment``'s options for replicas of ``threads`` CPUs each (see the module doc)."""
    if max_replicas is not None and max_replicas < replicas:
        raise ValueError(f"--max-replicas must be at least --replicas ({replicas}), got {max_replicas}")
    options: dict[str, Any] = {"name": DEPLOYMENT, "max_ongoing_requests": max_streams + max_queue,
                               "ray_actor_options": {"num_cpus": threads}}
    if max_replicas is None or max_replicas == replicas:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {"min_replicas": replicas, "max_replicas": max_replicas,
                                         "target_ongoing_requests": max_streams}
    return options


def build(make_app: Callable[[], Any], **options: Any):
    """The Ray Serve application: ``make_app()`` (an ASGI app) built on each replica."""
    from ray import serve

    return serve.deployment(serve.ingress(make_app)(), **options).bind()


def _interrupt(_signum, _frame) -> None:
    """SIGTERM ends the process through the same path as Ctrl-C, so that Ray is shut down behind it."""
    raise KeyboardInterrupt


def run(make_app: Callable[[], Any], *, model_id: str, host: str, port: int, replicas: int,
        max_replicas: int | None, threads: int, max_streams: int, max_queue: int,
        address: str | None = None) -> int:
    """Start (or join, with ``address``) a Ray cluster, deploy, and serve until interrupted or terminated."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError("serve-cluster needs Ray Serve: pip install 'qwen3-tts-edge[cluster]'") from None
    options = deployment_options(replicas, max_replicas, threads, max_streams, max_queue)
    if address is None:
        ray.init(include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    signal.signal(signal.SIGTERM, _interrupt)  # after ray.init, which installs its own
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build(make_app, **options), name=DEPLOYMENT, route_prefix="/")
        how = (f"{replicas} replicas" if "num_replicas" in options
               else f"{replicas} to {max_replicas} replicas (autoscaling)")
        print(f"serving {model_id} on http://{host}:{port}/v1/audio/speech: {how} of {threads} CPU(s) each",
              file=sys.stderr, flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    print("serve-cluster: stopped; the replicas and the local Ray cluster are shut down", file=sys.stderr)
    return 0
