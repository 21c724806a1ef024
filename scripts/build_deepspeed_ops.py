"""Build the two C++ ops DeepSpeed compiles the first time a CPU trial uses ZeRO, so the suite's ZeRO
tests load them instead of compiling inside a trial (scripts/test.sh runs this in the background while
the rest installs and lint and types run, one process per op: ``build_deepspeed_ops.py [BUILDER ...]``).

``deepspeed_shm_comm`` is built by every ZeRO run on the CPU (deepspeed/comm/torch.py, ``build_shm_op``),
``cpu_adam`` by offload (DeepSpeedCPUAdam). Each takes minutes on 2 cores. ``OpBuilder.load`` JIT-builds
through torch.utils.cpp_extension into ~/.cache/torch_extensions (TORCH_EXTENSIONS_DIR), under a lock
file that a trial loading the same op waits on; the same interpreter and flags make the same build, so
the trial finds it cached.
"""

from __future__ import annotations

import sys
import time


def main(names: list[str]) -> int:
    from deepspeed.accelerator import get_accelerator

    for name in names or ["ShareMemCommBuilder", "CPUAdamBuilder"]:
        started = time.monotonic()
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not builder.is_compatible():
            print(f"{name}: not built on this accelerator")
            continue
        builder.load()
        print(f"{name}: {builder.NAME} ready after {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
