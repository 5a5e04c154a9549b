"""MPS session logic on CPU (a stand-in control binary records what the session sends), and
the real daemon where one exists (marked ``mps``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_omni import mps
from vllm_omni.hw_emulation import PROFILES
from vllm_omni.mps import (
    SUN_PATH_BYTES,
    MpsSession,
    check_pipe_dir,
    client_env,
    estimated_sms,
    socket_path,
    thread_percentage,
)

REPO = Path(__file__).resolve().parents[1]
SNIPPET = REPO / "snippets" / "mps_setup.sh"


# --- percentages ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sms", "pct"), [(132, 100), (33, 25), (16, 12), (8, 6), (20, 15), (1, 1)])
def test_percentage_from_sm_count(sms, pct):
    assert thread_percentage(sm_count=sms) == pct
    assert estimated_sms(pct) >= sms - 1  # rounding down never loses more than one SM before the driver rounds


def test_percentage_from_share():
    assert thread_percentage(share=0.12) == 12
    assert thread_percentage(share=1.0) == 100
    assert thread_percentage(share=0.001) == 1


def test_profiles_sm_counts_map_to_the_studys_caps():
    caps = {k: thread_percentage(sm_count=PROFILES[k].sm_count) for k in ("orin_agx_64g", "orin_nx_16g")}
    assert caps == {"orin_agx_64g": 12, "orin_nx_16g": 6}  # the study's 12 % and 6 % rows


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of share"),
        ({"share": 0.5, "sm_count": 16}, "exactly one of share"),
        ({"share": 12}, "fraction in \\(0, 1\\]"),
        ({"share": 0}, "fraction in \\(0, 1\\]"),
        ({"sm_count": 0}, "integer in 1..132"),
        ({"sm_count": 200}, "integer in 1..132"),
        ({"sm_count": 8, "total_sms": 0}, "positive integer"),
    ],
)
def test_bad_percentage_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        thread_percentage(**kwargs)


# --- the two traps ------------------------------------------------------------------------------------

def test_socket_path_uses_the_longest_socket_name():
    assert socket_path("/tmp/mps-1000/pipe") == "/tmp/mps-1000/pipe/control_privileged"


def test_pipe_dir_limit_is_exactly_108_bytes():
    name_len = len("/control_privileged")
    ok = "/" + "a" * (SUN_PATH_BYTES - 1 - name_len - 1)  # socket path 107 bytes
    too_long = ok + "b"  # 108 bytes
    assert len(socket_path(ok)) == 107
    assert check_pipe_dir(ok) == Path(ok)
    with pytest.raises(ValueError, match="108 bytes.*shorter directory such as /tmp/mps-"):
        check_pipe_dir(too_long)


def test_session_refuses_long_pipe_dir_before_starting(tmp_path):
    deep = tmp_path / ("d" * 120)
    with pytest.raises(ValueError, match="shorter directory"):
        MpsSession(deep)


def test_client_env_forces_device_zero_and_daemon_keeps_its_index():
    base = {"CUDA_VISIBLE_DEVICES": "5", "PATH": "/usr/bin"}
    env = client_env(Path("/tmp/p"), Path("/tmp/l"), 12, base)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/p" and env["CUDA_MPS_LOG_DIRECTORY"] == "/tmp/l"
    assert mps.daemon_env(Path("/tmp/p"), Path("/tmp/l"), base)["CUDA_VISIBLE_DEVICES"] == "5"


# --- start and stop with a stand-in control binary ---------------------------------------------------

@pytest.fixture()
def fake_control(tmp_path, monkeypatch):
    """A stand-in ``nvidia-cuda-mps-control`` that logs its arguments, stdin and pipe dir."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    script = bindir / "nvidia-cuda-mps-control"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$#" -gt 0 ]; then echo "args $* pipe=$CUDA_MPS_PIPE_DIRECTORY vis=${{CUDA_VISIBLE_DEVICES:-unset}}" >> {log}
        else echo "stdin $(cat) pipe=$CUDA_MPS_PIPE_DIRECTORY" >> {log}; fi
        exit ${{FAKE_MPS_RC:-0}}
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_session_starts_and_stops(fake_control, tmp_path):
    root = tmp_path / "m"
    with MpsSession(root, sm_count=16, env={**os.environ, "CUDA_VISIBLE_DEVICES": "3"}) as s:
        assert s.running
        assert s.client_env()["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"
        assert (root / "pipe").is_dir() and (root / "log").is_dir()
        assert calls(fake_control) == [f"args -d pipe={root / 'pipe'} vis=3"]
    assert not s.running
    assert calls(fake_control)[-1] == f"stdin quit pipe={root / 'pipe'}"


def test_daemon_is_stopped_when_the_body_raises(fake_control, tmp_path):
    with pytest.raises(ZeroDivisionError):
        with MpsSession(tmp_path / "m", share=0.06):
            1 / 0
    assert [c.split()[0:2] for c in calls(fake_control)] == [["args", "-d"], ["stdin", "quit"]]


def test_stop_is_idempotent(fake_control, tmp_path):
    s = MpsSession(tmp_path / "m").start()
    s.stop()
    s.stop()
    assert sum(c.startswith("stdin quit") for c in calls(fake_control)) == 1


def test_failed_start_says_how_to_recover(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_RC", "1")
    with pytest.raises(RuntimeError, match="echo quit \\| CUDA_MPS_PIPE_DIRECTORY="):
        with MpsSession(tmp_path / "m"):
            pass
    assert not any(c.startswith("stdin") for c in calls(fake_control))


def test_a_hung_start_is_an_error_and_still_sends_quit(tmp_path):
    sent = []

    def runner(cmd, **kw):
        sent.append(kw.get("input") or " ".join(cmd[1:]))
        if cmd[1:] == ["-d"]:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with pytest.raises(RuntimeError, match="did not return within 5 s; quit was sent"):
        MpsSession(tmp_path / "m", runner=runner, control="sh", timeout_s=5).start()
    assert sent == ["-d", "quit\n"]


def test_a_failed_quit_is_warned_about(fake_control, tmp_path, monkeypatch):
    s = MpsSession(tmp_path / "m").start()
    monkeypatch.setenv("FAKE_MPS_RC", "1")
    s.base_env = {**s.base_env, "FAKE_MPS_RC": "1"}
    with pytest.warns(RuntimeWarning, match="quit to the MPS daemon .* failed \\(exit 1"):
        s.stop()
    assert not s.running


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="not found on PATH"):
        MpsSession(tmp_path / "m", control="no-such-mps-control-binary").start()


def test_sigterm_and_interpreter_exit_stop_the_daemon(fake_control, tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, time
        from vllm_omni.mps import MpsSession
        s = MpsSession({str(tmp_path / 'a')!r}).start()          # no context manager: atexit stops it
        with MpsSession({str(tmp_path / 'b')!r}):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 128 + 15, out.stderr
    quits = sorted(c.split("pipe=")[1] for c in calls(fake_control) if c.startswith("stdin quit"))
    assert quits == [str(tmp_path / "a" / "pipe"), str(tmp_path / "b" / "pipe")]


# --- the shell snippet ------------------------------------------------------------------------------

def test_snippet_prints_its_plan_without_mps(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin", "MPS_ROOT": str(tmp_path / "r"), "MPS_SM_COUNT": "8"}
    if shutil.which("nvidia-cuda-mps-control", path=env["PATH"]):
        pytest.skip("the MPS tools are installed here; the plan branch does not run")
    out = subprocess.run(["bash", "-euo", "pipefail", str(SNIPPET)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_percentage(sm_count=8)} " in out.stdout
    assert "CUDA_VISIBLE_DEVICES=0" in out.stdout
    assert not (tmp_path / "r").exists()  # a plan only: nothing created


def test_snippet_refuses_a_long_pipe_dir(tmp_path):
    env = {**os.environ, "MPS_ROOT": "/tmp/" + "x" * 100}
    out = subprocess.run(["bash", "-euo", "pipefail", str(SNIPPET)], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "use a shorter MPS_ROOT such as /tmp/mps-" in out.stderr


# --- the real daemon ----------------------------------------------------------------------------------

def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.mps
@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None or not _has_gpu(),
                    reason="needs nvidia-cuda-mps-control and a CUDA GPU")
def test_real_daemon_creates_its_sockets_and_quits():
    with MpsSession(mps.default_root() / "test", sm_count=16) as s:
        out = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", text=True,
                             env=s.client_env(), capture_output=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert Path(socket_path(s.pipe_dir)).exists()
    assert not s.running
