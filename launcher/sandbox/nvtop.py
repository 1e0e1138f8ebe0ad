#!/usr/bin/python3
"""Stand-in for nvtop inside sandbox containers: a GPU monitor, as people leave one running
in another tmux window.

Like nvtop, pynvml or wandb's system monitor it reads the GPUs through NVML, which opens
/dev/nvidiactl and every /dev/nvidia<minor> it can see and creates no CUDA context (no
/dev/nvidia-uvm; clearml/clearml#305): it holds device files without using a GPU. It prints
which GPUs it watches every few seconds until it is ended (q, C-c or a signal).

Runs on the container's own python3: stdlib only.
"""

import os
import sys
import time


def main() -> int:
    names = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n != "nvidia-uvm")
    files = [open("/dev/" + n, "rb") for n in names]  # noqa: SIM115 - held for our lifetime
    gpus = [n for n in names if n[6:].isdigit()]
    interval = float(os.environ.get("NVTOP_INTERVAL", "2"))
    try:
        while True:
            sys.stdout.write(
                "\rnvtop (sandbox): watching %d GPU(s): %s " % (len(gpus), " ".join(gpus))
            )
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        for f in files:
            f.close()


if __name__ == "__main__":
    sys.exit(main())
