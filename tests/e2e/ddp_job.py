#!/usr/bin/env python3
"""A real PyTorch DDP job (gloo, CPU) for the multi-node e2e test; one file, two roles.

    python3 ddp_job.py --torchrun <torchrun's arguments> ddp_job.py

starts PyTorch's own torchrun (torch.distributed.run.main) after one fix for Debian bookworm's
torch 1.13 on Python 3.11: `Std.from_str("0")` iterates the IntFlag `Std`, and 3.11's flag
iteration skips the zero member `Std.NONE`, so it returns None and torchrun fails at start
(`'NoneType' object has no attribute 'get'` in multiprocessing/api.py `to_map`); a None from it
is mapped to Std.NONE here. Without --torchrun it is a worker: a linear regression under DDP,
rank 0 printing DFlash-style status lines (the launcher's default format).
"""

import os
import sys
import time


def torchrun(argv):
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.run import main

    original = api.Std.from_str.__func__

    def from_str(cls, value):
        result = original(cls, value)
        if isinstance(result, dict):
            return {k: api.Std.NONE if v is None else v for k, v in result.items()}
        return api.Std.NONE if result is None else result

    api.Std.from_str = classmethod(from_str)
    main(argv)


def worker():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    truth = torch.randn(32, 1)
    if rank == 0:
        print(f"ddp: {os.environ['NNODES']} node(s), world size {world}", flush=True)
    step, samples, losses = 0, 0, []
    start = last = time.monotonic()
    while True:
        x = torch.randn(256, 32)
        y = x @ truth + 0.5 * torch.randn(256, 1)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        samples += 256 * world
        losses.append(float(loss))
        now = time.monotonic()
        if rank == 0 and now - last >= 0.5:
            ktok = samples * 64 / 1000.0 / (now - last)  # 64 tokens a sample
            loss_mean = sum(losses) / len(losses)
            print(
                f"[{int((now - start) // 60)}m] step={step} loss={loss_mean:.4f} acc=0.500 "
                "streak=1.0 lr=5.00e-02 noise=0.1000 | tgt=1.00b/s dft=1.00b/s "
                f"({ktok:.1f}Ktok/s) | q_pre=[6, 6, 6, 6, 6, 6] q_hs=[1] | epoch~0.00 ETA=1.0h",
                flush=True,
            )
            samples, losses, last = 0, [], now


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torchrun"]:
        torchrun(sys.argv[2:])
    else:
        worker()
