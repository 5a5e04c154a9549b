"""A user-level CUDA MPS session: fewer SMs for every process of a deployment, no root needed.

Why: capping ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under a private MPS control daemon is the
one way to give an engine an edge device's SM count on a big GPU. Two traps cost the study
runs, and this module refuses both up front:

* The daemon listens on Unix sockets inside ``CUDA_MPS_PIPE_DIRECTORY``. A socket path has
  room for 107 bytes (108 with the terminating NUL), and the longest socket the daemon
  creates is ``<pipe dir>/control_privileged`` (next to ``control``, the one its log names).
  A deep working directory silently breaks the daemon, so :func:`check_pipe_dir` rejects
  any pipe directory whose longest socket path is 108 bytes or more.
* Clients inside the MPS namespace see the daemon's GPU as device 0, whatever index the
  job scheduler gave it: :func:`client_env` forces ``CUDA_VISIBLE_DEVICES=0``.

:class:`MpsSession` starts the daemon (``nvidia-cuda-mps-control -d``) and always stops it
(``echo quit | nvidia-cuda-mps-control``): on normal exit, on exceptions, on Ctrl-C, on
SIGTERM (turned into ``SystemExit`` while the session is open, when it was entered from the
main thread) and at interpreter exit.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import signal
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

CONTROL = "nvidia-cuda-mps-control"
SOCKET_NAMES = ("control", "control_privileged")  # sockets the control daemon creates in the pipe dir
SUN_PATH_BYTES = 108  # sizeof(sockaddr_un.sun_path) on Linux, NUL included
SM_COUNTS = {"h200": 132, "orin_agx_64g": 16, "orin_nx_16g": 8, "thor": 20}
DEFAULT_TOTAL_SMS = SM_COUNTS["h200"]


def default_root(uid: int | None = None) -> Path:
    """``/tmp/mps-<uid>``: short, private to the user, the same on every run."""
    return Path(f"/tmp/mps-{os.getuid() if uid is None else uid}")


def socket_path(pipe_dir: str | os.PathLike[str]) -> str:
    """The longest socket path the daemon will create in ``pipe_dir``."""
    longest = max(SOCKET_NAMES, key=len)
    return os.path.join(os.fspath(pipe_dir), longest)


def check_pipe_dir(pipe_dir: str | os.PathLike[str]) -> Path:
    """Return ``pipe_dir`` as an absolute Path, or raise if its sockets would not fit."""
    path = Path(pipe_dir).absolute()
    sock = socket_path(path)
    size = len(os.fsencode(sock))
    if size >= SUN_PATH_BYTES:
        raise ValueError(
            f"MPS pipe directory too long: its socket {sock} is {size} bytes, and a Unix socket path "
            f"must be under {SUN_PATH_BYTES}; use a shorter directory such as {default_root()} "
            f"(/tmp/mps-$UID)"
        )
    return path


def thread_percentage(*, share: float | None = None, sm_count: int | None = None,
                      total_sms: int = DEFAULT_TOTAL_SMS) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for an SM share (0-1] or an SM count.

    Rounded down, so the cap never grants more SMs than asked before the driver's own
    rounding (16 of 132 SMs -> 12 %, 8 -> 6 %, 20 -> 15 %); at least 1.
    """
    if (share is None) == (sm_count is None):
        raise ValueError("give exactly one of share (a fraction in (0, 1]) or sm_count "
                         f"(1..total_sms; known devices: {', '.join(f'{k}={v}' for k, v in SM_COUNTS.items())})")
    if not isinstance(total_sms, int) or total_sms < 1:
        raise ValueError(f"total_sms must be a positive integer, got {total_sms!r}")
    if share is not None:
        if not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"share must be a fraction in (0, 1], got {share!r} (for 12 % pass 0.12)")
        exact = share * 100
    else:
        if not isinstance(sm_count, int) or not 1 <= sm_count <= total_sms:
            raise ValueError(f"sm_count must be an integer in 1..{total_sms}, got {sm_count!r}")
        exact = 100 * sm_count / total_sms
    return max(1, math.floor(exact + 1e-9))


def estimated_sms(percentage: int, total_sms: int = DEFAULT_TOTAL_SMS) -> int:
    """SMs a percentage grants before the driver's rounding: ``ceil(pct x total / 100)``."""
    return math.ceil(percentage * total_sms / 100 - 1e-9)


def daemon_env(pipe_dir: Path, log_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The daemon keeps the scheduler's ``CUDA_VISIBLE_DEVICES``: it owns the real GPU index."""
    env = dict(os.environ if base is None else base)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
    return env


def client_env(pipe_dir: Path, log_dir: Path, percentage: int | None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A client sees only the daemon's GPU, always as device 0."""
    env = daemon_env(pipe_dir, log_dir, base)
    env["CUDA_VISIBLE_DEVICES"] = "0"
    if percentage is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percentage)
    return env


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class MpsSession:
    """Start a private MPS control daemon on enter, stop it on every way out.

    >>> with MpsSession(sm_count=16) as mps:              # doctest: +SKIP
    ...     subprocess.run(cmd, env=mps.client_env(), check=True)
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        pipe_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        share: float | None = None,
        sm_count: int | None = None,
        total_sms: int = DEFAULT_TOTAL_SMS,
        control: str = CONTROL,
        runner: Runner = subprocess.run,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ):
        root_path = Path(root) if root is not None else default_root()
        self.pipe_dir = check_pipe_dir(pipe_dir if pipe_dir is not None else root_path / "pipe")
        self.log_dir = Path(log_dir if log_dir is not None else root_path / "log").absolute()
        self.percentage = (None if share is None and sm_count is None
                           else thread_percentage(share=share, sm_count=sm_count, total_sms=total_sms))
        self.control = control
        self.runner = runner
        self.base_env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s
        self.running = False
        self._old_sigterm: Any = None

    # --- the two commands --------------------------------------------------------------------------
    def _control_path(self) -> str:
        found = shutil.which(self.control)
        if found is None:
            raise RuntimeError(f"{self.control} not found on PATH: install the NVIDIA driver's MPS tools, "
                               "or run on a machine with a CUDA GPU")
        return found

    def start(self) -> "MpsSession":
        if self.running:
            return self
        control = self._control_path()
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            out = self.runner([control, "-d"], env=daemon_env(self.pipe_dir, self.log_dir, self.base_env),
                              capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.running = True  # it may have started before it hung: send it quit all the same
            self.stop()
            raise RuntimeError(f"{self.control} -d did not return within {self.timeout_s:g} s; quit was sent to "
                               f"{self.pipe_dir} in case a daemon started") from None
        if out.returncode != 0:
            raise RuntimeError(f"{self.control} -d failed (exit {out.returncode}): "
                               f"{(out.stderr or out.stdout).strip() or 'no output'}; "
                               f"if a daemon already runs there, stop it with: "
                               f"echo quit | CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir} {self.control}")
        self.running = True
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Send ``quit``; safe to call twice and from atexit."""
        if not self.running:
            return
        self.running = False
        atexit.unregister(self.stop)
        control = shutil.which(self.control) or self.control
        try:  # from atexit and signal handlers too: a failed quit is said, never raised
            out = self.runner([control], input="quit\n", env=daemon_env(self.pipe_dir, self.log_dir, self.base_env),
                              capture_output=True, text=True, timeout=self.timeout_s)
            failed = f"exit {out.returncode}: {(out.stderr or out.stdout).strip()}" if out.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed = str(exc)
        if failed:
            warnings.warn(f"quit to the MPS daemon in {self.pipe_dir} failed ({failed}); stop it with: "
                          f"echo quit | CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir} {self.control}",
                          RuntimeWarning, stacklevel=2)

    # --- clients ---------------------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        return client_env(self.pipe_dir, self.log_dir, self.percentage, self.base_env)

    def run_client(self, cmd: Sequence[str], **kwargs: Any) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(list(cmd), env=self.client_env(), text=True, **kwargs)

    # --- context manager: every exit path stops the daemon ---------------------------------------
    def __enter__(self) -> "MpsSession":
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_to_exit)
        try:
            return self.start()
        except BaseException:
            self._restore_signal()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_signal()

    def _restore_signal(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _sigterm_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
