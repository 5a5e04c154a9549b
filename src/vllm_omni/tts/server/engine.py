"""The server's engine: one worker thread owns the model and steps every accepted stream together.

Why together: a stream's step on a CPU is bound by reading the weights, and streams that step in
one call read each weight tile once for all of them (``vllm_omni.tts.batch``). Up to
``max_streams`` requests speak at once, each frame of all of them in one talker call and one
predictor call, and the streams whose chunks fill at a step decoded together (``decode_together``:
one pass of the decoder, each stream from its own state); up to ``max_queue`` more wait. What a
request can count on:

- ``submit`` refuses at once (``Busy``, with a retry hint) when the streams and the queue are
  full: the backlog never grows without bound;
- a request joins the running ones at their next step (its prompt's rows ride in their talker
  call) and leaves at its end without stalling them;
- a request that is cancelled (its client went away) or passes its deadline stops at its next
  frame and frees its place, or is skipped if it has not started;
- an error inside one request (its prompt, its decoding, its listener) ends that request with
  the error and the others go on; bad input found before the first audio is a ``PromptError``,
  naming the parameter. An error in a step that all of them share ends all of them.

Why the worker can load the model itself (``load=``): OpenMP keeps a pool of threads for each
thread that starts parallel regions. A model loaded in the main thread leaves one pool there,
and the worker's steps start a second; on the development host (Zen 4, 2 cores) the talker and
predictor then ran 1.3 to 1.5 times slower than in one thread that both loaded and stepped.
``qwen3-tts-edge serve`` loads in the worker.

A cloned voice rides in ``Job.voice``; a request that brings its own reference audio is cloned
in the worker when it starts (``Job.clone``), and anything else that needs the model, such as
saving a voice, runs there too between two steps (``call``).

Events reach the caller through ``Job.events``, a callable the worker calls from its thread with
``("audio", AudioChunk)``, then ``("end", SpeechStats)`` or ``("error", exception)``.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable


class Busy(Exception):
    """The queue is full; ``retry_after_s`` is when a place is likely to be free."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Timeout(Exception):
    """The request passed its deadline."""


@dataclass(eq=False)
class Job:
    """One accepted request: what to say, its deadline, where its events go, and its cancel flag."""

    text: str
    speaker: str | None
    language: str | None
    instruct: str | None
    events: Callable[[str, Any], None]
    deadline: float  # time.monotonic() by which the request must be done
    seed: int = 0
    max_frames: int | None = None  # this request's cap (server.limits); None: the engine's
    voice: Any = None  # a cloned voice (a Base checkpoint's saved voice)
    clone: Any = None  # (ReferenceAudio, ref_text, x_vector_only): cloned in the worker when the job starts
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: float | None = None
    speaking: Any = None  # pipeline.Speaking, once started
    utterance: Any = None  # batch.Utterance, once started

    def cancel(self) -> None:
        self.cancelled.set()

    def should_stop(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


class SpeechEngine:
    """Accepts ``Job``s into a bounded queue and speaks up to ``max_streams`` of them together (see the module doc)."""

    def __init__(self, speech: Any = None, *, load: Callable[[], Any] | None = None, max_streams: int = 2,
                 max_queue: int = 4, timeout_s: float = 120.0, max_frames: int | None = None):
        """``speech`` (a loaded ``Speech``), or ``load``, called in the worker thread to load one (see the
        module doc); its errors are raised here."""
        if (speech is None) == (load is None):
            raise ValueError("give speech or load, not both")
        if not 1 <= max_streams:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.speech, self.max_streams, self.max_queue = speech, int(max_streams), int(max_queue)
        self.timeout_s = float(timeout_s)
        self.max_frames = max_frames  # a request's limit (None: the checkpoint's, ``frame_limit``)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: list[Job] = []
        self._steps = 0  # steps run: every `steady` of them a chunk boundary all streams share
        self._calls: collections.deque[tuple[Callable[[Any], Any], Future]] = collections.deque()
        self._closed = False
        self._recent_s: collections.deque[float] = collections.deque(maxlen=8)  # wall time of finished requests
        self.served = self.failed = self.rejected = self.cancelled = 0
        self._thread = threading.Thread(target=self._work, args=(load,), name="speech-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()
            raise self._load_error

    def _set_up(self, load: Callable[[], Any] | None) -> bool:
        """In the worker: load the model if asked, check max_streams against it; False on an error."""
        try:
            if load is not None:
                self.speech = load()
            limit = self.speech.generator.batch.max_streams
            if self.max_streams > limit:
                raise ValueError(f"max_streams must be in 1..{limit}, got {self.max_streams}")
            self.batch = self.speech.generator.batch
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor's caller
            self._load_error = exc
        self._ready.set()
        return self._load_error is None

    # --- the caller's side ------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``Busy`` if ``max_streams`` requests speak and ``max_queue`` wait already."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is shut down")
            speaking = len(self._running)
            if speaking + len(self._queue) >= self.max_streams + self.max_queue:
                self.rejected += 1
                raise Busy(f"server busy: {speaking} requests speaking and {len(self._queue)} waiting "
                           f"(at most {self.max_streams} and {self.max_queue})",
                           self._retry_after(len(self._queue) + 1))
            self._queue.append(job)
            self._cond.notify()

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(speech)`` in the worker between two steps (cloning a voice: the worker owns the model and its
        threads); its result or exception comes through the returned future."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is shut down")
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, future = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.speech))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)

    def _retry_after(self, ahead: int) -> int:
        typical = sorted(self._recent_s)[len(self._recent_s) // 2] if self._recent_s else 5.0
        return max(1, round(typical * ahead / self.max_streams))

    @property
    def frame_limit(self) -> int:
        """The most frames a request may ask for: ``max_frames``, else the checkpoint's own limit."""
        own = self.speech.frame_limit
        return own if self.max_frames is None else min(self.max_frames, own)

    def status(self) -> dict[str, int]:
        with self._cond:
            return {"speaking": len(self._running), "queued": len(self._queue), "max_streams": self.max_streams,
                    "max_queue": self.max_queue, "served": self.served, "failed": self.failed,
                    "rejected": self.rejected, "cancelled": self.cancelled}

    def close(self, wait_s: float = 10.0) -> None:
        """Refuse new work, cancel what waits or runs, and let the worker end."""
        with self._cond:
            self._closed = True
            for job in list(self._queue) + self._running:
                job.cancel()
            for _, future in self._calls:
                future.cancel()
            self._calls.clear()
            self._cond.notify_all()
        self._thread.join(wait_s)

    # --- the worker -------------------------------------------------------------------------

    def _admit(self) -> list[Job] | None:
        """Move waiting jobs into the free places (waiting while there is nothing to do); None: closed."""
        with self._cond:
            while not self._queue and not self._running and not self._calls and not self._closed:
                self._cond.wait()
            if self._closed and not self._queue and not self._running:
                return None
            new = []
            while self._queue and len(self._running) < self.max_streams:
                job = self._queue.popleft()
                self._running.append(job)
                new.append(job)
            return new

    def _work(self, load: Callable[[], Any] | None) -> None:
        from vllm_omni.tts.pipeline import decode_together

        if not self._set_up(load):
            return
        while True:
            new = self._admit()
            if new is None:
                return
            self._run_calls()
            for job in new:
                self._begin(job)
            for job in list(self._running):
                if job.utterance is not None and job.should_stop():
                    job.speaking.stats.stopped = True
                    self._end(job)
            live = [job for job in self._running if job.utterance is not None]
            if not live:
                continue
            try:
                made = self.batch.step([job.utterance for job in live])
            except Exception as exc:  # noqa: BLE001 - a shared step failed: every stream in it ends
                for job in live:
                    self._fail(job, exc)
                continue
            owner = {id(job.utterance): job for job in live}
            self._steps += 1
            due = []  # the streams whose chunk this frame filled: decoded together, each from its own state
            for utterance, codes in made:
                job = owner[id(utterance)]
                try:
                    # every `steady` steps a shared boundary: the streams' chunks end at the same steps
                    if job.speaking.take(codes, boundary=self._steps % job.speaking.steady == 0):
                        due.append(job)
                except Exception as exc:  # noqa: BLE001 - one request's failure ends that request only
                    self._fail(job, exc)
            # the streams in their first chunks first: a new stream's first audio does not wait for the
            # others' chunks of four frames, which have audio playing already; then the others together
            for group in ([j for j in due if j.speaking.opening], [j for j in due if not j.speaking.opening]):
                if not group:
                    continue
                try:
                    chunks = decode_together([job.speaking for job in group])
                except Exception as exc:  # noqa: BLE001 - a shared decode failed: every stream in it ends
                    for job in group:
                        self._fail(job, exc)
                else:
                    for job, chunk in zip(group, chunks):
                        self._emit(job, "audio", chunk)
            for job in live:
                if job in self._running and job.utterance.done:
                    self._end(job)

    def _begin(self, job: Job) -> None:
        """Start a job that just got a place: its prompt and its utterance, or its refusal."""
        if job.cancelled.is_set():
            self._leave(job)
            return
        if time.monotonic() > job.deadline:
            self._emit(job, "error", Timeout("the request waited past its timeout before it could start"))
            self._leave(job)
            return
        job.started = time.monotonic()
        try:
            if job.clone is not None:  # a request that brought its reference: cloned here, in the worker
                audio, ref_text, x_vector_only = job.clone
                job.voice = self.speech.clone(audio, ref_text, x_vector_only)
            job.speaking = self.speech.open(job.text, speaker=job.speaker, voice=job.voice, language=job.language,
                                            instruct=job.instruct, seed=job.seed,
                                            max_frames=job.max_frames or self.max_frames,
                                            stop=job.should_stop)
            sp = job.speaking
            job.utterance = self.batch.start(sp.prompt, sp.sampling, sp.max_frames, sp.stats.generation)
        except Exception as exc:  # noqa: BLE001 - a bad prompt ends its own request
            self._fail(job, exc)

    def _end(self, job: Job) -> None:
        """A job whose utterance ended (EOS, its frame limit, or stopped): its last chunk and its end."""
        sp = job.speaking
        try:
            chunk = sp.finish()
            if chunk is not None:
                self._emit(job, "audio", chunk)
            if sp.stats.stopped and job.cancelled.is_set():
                self.cancelled += 1  # nobody is listening any more
                self._leave(job)
                return
            if sp.stats.stopped:
                raise Timeout(f"the request passed its timeout after {sp.stats.frames} frames")
        except Exception as exc:  # noqa: BLE001
            self._fail(job, exc)
            return
        self.served += 1
        self._recent_s.append(time.monotonic() - job.started)
        self._emit(job, "end", sp.stats)
        self._leave(job)

    def _fail(self, job: Job, exc: Exception) -> None:
        self.failed += 1
        self._emit(job, "error", exc)
        self._leave(job)

    def _leave(self, job: Job) -> None:
        """Free the job's place and its caches."""
        if job.utterance is not None:
            self.batch.release(job.utterance)
        with self._cond:
            if job in self._running:
                self._running.remove(job)

    @staticmethod
    def _emit(job: Job, kind: str, value: Any) -> None:
        """Hand an event to the job's caller; a caller that is gone (its loop closed) cancels the job."""
        try:
            job.events(kind, value)
        except RuntimeError:
            job.cancel()
