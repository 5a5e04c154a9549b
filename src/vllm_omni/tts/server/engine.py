"""The server's engine: one worker thread owns the model and speaks the accepted requests.

Why one thread: the fused kernels already use every core for one stream's step, and a step of
two streams that do not share their weight reads costs twice as much, so streams run one after
the other here and the others wait in a bounded queue (batched steps, which read each weight
once for several streams, are the next step). What a request can count on:

- ``submit`` refuses at once (``Busy``, with a retry hint) when the running stream and the
  queue are full: the backlog never grows without bound;
- a request that is cancelled (its client went away) or passes its deadline stops at its next
  frame, or is skipped if it has not started;
- an error inside one request ends that request with the error and the engine goes on with
  the next; bad input found before the first audio is a ``PromptError``, naming the parameter.

Events reach the caller through ``Job.events``, a callable the worker calls from its thread with
``("audio", AudioChunk)``, then ``("end", SpeechStats)`` or ``("error", exception)``.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class Busy(Exception):
    """The queue is full; ``retry_after_s`` is when a place is likely to be free."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Timeout(Exception):
    """The request passed its deadline."""


@dataclass
class Job:
    """One accepted request: what to say, its deadline, where its events go, and its cancel flag."""

    text: str
    speaker: str | None
    language: str | None
    instruct: str | None
    events: Callable[[str, Any], None]
    deadline: float  # time.monotonic() by which the request must be done
    seed: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


class SpeechEngine:
    """Accepts ``Job``s into a bounded queue and speaks them one at a time with ``speech`` (see the module doc)."""

    def __init__(self, speech: Any, *, max_queue: int = 4, timeout_s: float = 120.0, max_frames: int | None = None):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.speech, self.max_queue, self.timeout_s = speech, int(max_queue), float(timeout_s)
        self.max_frames = max_frames  # a request's limit (None: the checkpoint's)
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._closed = False
        self._recent_s: collections.deque[float] = collections.deque(maxlen=8)  # wall time of finished requests
        self.served = self.failed = self.rejected = self.cancelled = 0
        self._thread = threading.Thread(target=self._work, name="speech-engine", daemon=True)
        self._thread.start()

    # --- the caller's side ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``Busy`` if the running request and ``max_queue`` waiting ones are there already."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is shut down")
            speaking = int(self._running is not None)
            if speaking + len(self._queue) >= 1 + self.max_queue:  # also between two requests, when none speaks
                self.rejected += 1
                raise Busy(f"server busy: {speaking} request speaking and {len(self._queue)} waiting "
                           f"(at most 1 and {self.max_queue})", self._retry_after(len(self._queue) + 1))
            self._queue.append(job)
            self._cond.notify()

    def _retry_after(self, ahead: int) -> int:
        typical = sorted(self._recent_s)[len(self._recent_s) // 2] if self._recent_s else 5.0
        return max(1, round(typical * ahead))

    def status(self) -> dict[str, int]:
        with self._cond:
            return {"speaking": int(self._running is not None), "queued": len(self._queue),
                    "max_queue": self.max_queue, "served": self.served, "failed": self.failed,
                    "rejected": self.rejected, "cancelled": self.cancelled}

    def close(self, wait_s: float = 10.0) -> None:
        """Refuse new work, cancel what waits or runs, and let the worker end."""
        with self._cond:
            self._closed = True
            for job in self._queue:
                job.cancel()
            if self._running is not None:
                self._running.cancel()
            self._cond.notify_all()
        self._thread.join(wait_s)

    # --- the worker -------------------------------------------------------------------------

    def _next(self) -> Job | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed and not self._queue:
                return None
            job = self._queue.popleft()
            self._running = job
            return job

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                self._speak(job)
            finally:
                with self._cond:
                    self._running = None

    def _speak(self, job: Job) -> None:
        if job.cancelled.is_set():
            return
        if time.monotonic() > job.deadline:
            self._emit(job, "error", Timeout("the request waited past its timeout before it could start"))
            return
        job.started = time.monotonic()
        try:
            for chunk in self.speech.stream(job.text, speaker=job.speaker, language=job.language,
                                            instruct=job.instruct, seed=job.seed,
                                            max_frames=self.max_frames, stop=job.should_stop):
                self._emit(job, "audio", chunk)
            stats = self.speech.last_stats
            if stats.stopped and job.cancelled.is_set():
                self.cancelled += 1  # nobody is listening any more
                return
            if stats.stopped:
                raise Timeout(f"the request passed its timeout after {stats.frames} frames")
        except Exception as exc:  # noqa: BLE001 - one request's failure ends that request only
            self.failed += 1
            self._emit(job, "error", exc)
            return
        self.served += 1
        self._recent_s.append(time.monotonic() - job.started)
        self._emit(job, "end", stats)

    @staticmethod
    def _emit(job: Job, kind: str, value: Any) -> None:
        """Hand an event to the job's caller; a caller that is gone (its loop closed) cancels the job."""
        try:
            job.events(kind, value)
        except RuntimeError:
            job.cancel()
