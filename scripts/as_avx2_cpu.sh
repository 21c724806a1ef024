#!/usr/bin/env bash
# Run a command as it would run on a CPU without bf16 instructions (AVX2, no AVX-512, no AMX), on a machine
# that has them: the suite must pass on both kinds (issue 37; this project's machines have had AMD EPYC
# with AVX2 only and Xeons with AVX512-BF16).
#   sudo bash scripts/as_avx2_cpu.sh bash scripts/test.sh -m "not slow"
# What the command sees:
# - /proc/cpuinfo without the avx512* and amx* flags (bind-mounted over, in a private mount namespace:
#   `unshare -m`, which needs root), which is where autotune reads a CPU's instructions
#   (autotune/spec/devices.py, cpu_flags);
# - torch's kernels held to AVX2: ATen's dispatch (ATEN_CPU_CAPABILITY=avx2, aten/src/ATen/native/DispatchStub.cpp)
#   and oneDNN's (ONEDNN_MAX_CPU_ISA=AVX2, oneDNN's "CPU dispatcher control"), so bf16 matmuls run
#   emulated as they do there (measured here, 512x512, one thread: bf16 557 GFLOP/s native, 0.7 emulated;
#   fp32 76 -> 30 GFLOP/s; torch.ops.mkldnn._is_mkldnn_bf16_supported() True -> False).
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/as_avx2_cpu.sh COMMAND [ARGS...]" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/as_avx2_cpu.sh: needs root for its private mount namespace (unshare -m); run it with sudo" >&2
  exit 2
fi
masked=$(mktemp)
trap 'rm -f "$masked"' EXIT
sed -E 's/ (avx512[a-z_0-9]*|amx[a-z_0-9]*)//g' /proc/cpuinfo > "$masked"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
unshare -m bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$masked" "$@"
