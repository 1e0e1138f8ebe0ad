"""A small DistributedDataParallel job (CPU, gloo) run by PyTorch's own torchrun, for the
end-to-end tests. One file, because a playbook uploads one script:

    python3 ddp_trainer.py torchrun --standalone --nproc_per_node 2 [torchrun options]

starts torchrun's elastic agent (torch.distributed.run.main) on this same file, whose workers
then train. Rank 0 prints torchtitan's status line (the `torchtitan` preset reads it):

    [titan] 2026-01-01 00:00:00,000 - root - INFO - step:  5  loss:  1.2345  grad_norm:  0.5  ...

DDP_MODE picks a fault, DDP_AFTER seconds after the workers start (rank 1 is the faulty one):
healthy; raise (a RuntimeError, so torchrun restarts the group); hang (rank 1 stops before an
all-reduce the others wait in); nan (inputs with a NaN: the loss and gradients become nan on
every rank); straggler (rank 1 sleeps every step: every rank waits for it in the all-reduce).
"""

from __future__ import annotations

import logging
import os
import sys
import time

STEP_PAUSE = 0.02  # between steps: two workers on a shared 2-core machine leave room for others
PRINT_EVERY = 0.5  # seconds between status lines
STRAGGLE = 0.25  # rank 1's extra time per step in straggler mode
FEATURES, BATCH = 32, 64


def torchrun(argv: list[str]) -> None:
    """torchrun, with the fix its 1.13 release needs on Python 3.11: `Std.from_str` finds the
    value by iterating `Std`, and 3.11's flag iteration skips NONE (0) and ALL (3), so the
    default `--redirects 0` comes back None and the agent fails in `to_map` with
    AttributeError: 'NoneType' object has no attribute 'get'."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import Std

    checked = Std.from_str

    def from_str(value: str) -> Std | dict[int, Std]:
        checked(value)  # raises for what torchrun rejects
        if ":" not in value:
            return Std(int(value))
        return {int(i): Std(int(v)) for i, v in (m.split(":") for m in value.split(","))}

    Std.from_str = staticmethod(from_str)  # type: ignore[method-assign,assignment]
    run.main([*argv, os.path.abspath(__file__)])


def train() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    logging.basicConfig(
        format="[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s", level="INFO"
    )
    log = logging.getLogger("root")
    mode = os.environ.get("DDP_MODE", "healthy")
    after = float(os.environ.get("DDP_AFTER", "3"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        log.info("Training starts: world size %d, mode %s", world, mode)
    started = last_print = time.monotonic()
    step = samples = 0
    while True:
        faulty = rank == 1 and time.monotonic() - started > after
        if faulty and mode == "raise":
            raise RuntimeError(f"rank {rank}: injected failure at step {step}")
        if faulty and mode == "hang":
            time.sleep(3600)  # the other ranks block in the next all-reduce
        x = torch.randn(BATCH, FEATURES)
        if mode == "nan" and time.monotonic() - started > after:
            x[0, 0] = float("nan")
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()  # the gradients' all-reduce: every rank waits for the slowest
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
        optimizer.step()
        step += 1
        samples += BATCH * world
        time.sleep(STEP_PAUSE + (STRAGGLE if faulty and mode == "straggler" else 0))
        now = time.monotonic()
        if rank == 0 and now - last_print >= PRINT_EVERY:
            tps = round(samples * FEATURES / (now - last_print))
            log.info(
                f"step: {step:2}  loss: {loss.item():7.4f}  grad_norm: {grad_norm:7.4f}  "
                f"memory:  0.00GiB(0.00%)  tps: {tps:,}  tflops: 0.00  mfu: 0.00%"
            )
            samples, last_print = 0, now


if __name__ == "__main__":
    if sys.argv[1:2] == ["torchrun"]:
        torchrun(sys.argv[2:])
    else:
        train()
