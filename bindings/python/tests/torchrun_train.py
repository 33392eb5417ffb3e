# torchrun_train.py: a torch script as users write it, run unchanged by torchrun and by
# gcoll-run (test-torchrun.sh): env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""Checks, on every rank: the default group is gcoll's; an all_reduce against the value
computed here; DDP for 5 steps leaves identical weights everywhere. With
TORCHRUN_TEST_FAIL_FIRST=1, rank 1 exits with status 3 on the elastic agent's first attempt
(TORCHELASTIC_RESTART_COUNT 0), so that --max-restarts starts the job again; the restarted
ranks must build a fresh communicator. Prints one line "torchrun-ok rank R/N attempt A"."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll.torch  # noqa: F401  (registers the backend "gcoll")


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    assert int(os.environ["LOCAL_RANK"]) < int(os.environ["LOCAL_WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gcoll")
    if os.environ.get("TORCHRUN_TEST_FAIL_FIRST") == "1" and attempt == 0 and rank == 1:
        sys.exit(3)
    assert dist.get_backend() == "gcoll", dist.get_backend()
    assert (dist.get_rank(), dist.get_world_size()) == (rank, size)
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), size * (size + 1) / 2.0)), t
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(4, 8, generator=g)).square().mean().backward()
        opt.step()
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(w) for _ in range(size)]
    dist.all_gather(everyone, w)
    assert all(torch.equal(e, w) for e in everyone), "weights differ across ranks"
    dist.destroy_process_group()
    # one write(2) of the whole line: the ranks share the output file, and print's text and
    # newline are two writes when the stream is unbuffered (interleaved lines seen)
    sys.stdout.flush()
    os.write(1, b"torchrun-ok rank %d/%d attempt %d\n" % (rank, size, attempt))


if __name__ == "__main__":
    main()
