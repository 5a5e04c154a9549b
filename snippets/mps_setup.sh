# Cap a deployment to an edge device's SM count with a private MPS daemon (no root needed).
# Settings: MPS_SM_COUNT (default 16, Orin AGX class), MPS_TOTAL_SMS (default 132, H200),
# MPS_ROOT (default /tmp/mps-$UID). Without the MPS tools or a GPU it prints its plan and exits 0.
MPS_SM_COUNT="${MPS_SM_COUNT:-16}"
MPS_TOTAL_SMS="${MPS_TOTAL_SMS:-132}"
MPS_ROOT="${MPS_ROOT:-/tmp/mps-$(id -u)}"
pipe_dir="$MPS_ROOT/pipe"
log_dir="$MPS_ROOT/log"

# Rounded down, at least 1: 16 of 132 SMs -> 12 %.
pct=$(( 100 * MPS_SM_COUNT / MPS_TOTAL_SMS ))
if (( pct < 1 )); then pct=1; fi

# Trap 1: the daemon's longest socket path must stay under 108 bytes.
sock="$pipe_dir/control_privileged"
sock_bytes=$(printf '%s' "$sock" | wc -c)
if (( sock_bytes >= 108 )); then
    echo "error: MPS socket path $sock is $sock_bytes bytes (limit 107); use a shorter MPS_ROOT such as /tmp/mps-\$UID" >&2
    exit 1
fi

# Trap 2: inside the MPS namespace the daemon's GPU is always device 0.
client_env=(CUDA_MPS_PIPE_DIRECTORY="$pipe_dir" CUDA_MPS_LOG_DIRECTORY="$log_dir"
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$pct" CUDA_VISIBLE_DEVICES=0)

if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no MPS control daemon or no GPU here; the plan would be:"
    echo "  mkdir -p $pipe_dir $log_dir"
    echo "  CUDA_MPS_PIPE_DIRECTORY=$pipe_dir CUDA_MPS_LOG_DIRECTORY=$log_dir nvidia-cuda-mps-control -d"
    echo "  clients: env ${client_env[*]} <command>"
    echo "  stop: echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe_dir nvidia-cuda-mps-control"
    echo "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct ($MPS_SM_COUNT of $MPS_TOTAL_SMS SMs)"
    exit 0
fi

mkdir -p "$pipe_dir" "$log_dir"
chmod 700 "$MPS_ROOT" "$pipe_dir" "$log_dir"
export CUDA_MPS_PIPE_DIRECTORY="$pipe_dir" CUDA_MPS_LOG_DIRECTORY="$log_dir"
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control' EXIT   # stop the daemon however the script ends

# One client: a short bf16 matmul under the cap, if torch with CUDA is at hand. The check runs
# as a client too (the pipe directory is exported by now), so it gets the client's device 0.
if env "${client_env[@]}" "${PYTHON:-python3}" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    env "${client_env[@]}" "${PYTHON:-python3}" - <<'PY'
import os, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
a @ a  # the first product creates cuBLAS's handle and loads its kernel: not timed
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    a @ a
torch.cuda.synchronize()
tflops = 20 * 2 * 8192**3 / (time.perf_counter() - t0) / 1e12
print(f"MPS cap {os.environ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE']} %: {tflops:.1f} TFLOPS bf16")
PY
else
    echo "MPS daemon up in $pipe_dir with a $pct % cap; no CUDA-enabled torch here to run a client"
fi
