#!/usr/bin/env python3
# bench/torch_backend.py: torch.distributed on the "gcoll" backend beside Gloo, same run.
"""all_reduce times by size on each backend in turn and gcoll's C call (gcoll_allreduce
through the ctypes binding, on a communicator of its own) for the backend's per-call
overhead, then DDP steps of an MLP, and the DDP hook's per-bucket cost of the non-finite
check. Run on P ranks (gcoll-run exports torch's RANK, WORLD_SIZE, MASTER_ADDR/PORT):

    tools/gcoll-run -n 4 -x PYTHONPATH=$PWD/bindings/python -- \\
        .venv/bin/python bench/torch_backend.py [--sizes 4,64k,4m,64m] [--iters 20]

or under torchrun (`torchrun --standalone --nproc-per-node 4 bench/torch_backend.py`; the C
call's communicator then meets at MASTER_PORT + 7).

The per-call overhead is also measured apart, on groups of one rank (bench_overhead): no
peer and no network, but every rank times its calls at once, so with fewer CPUs than ranks
the thread hand-offs wait for a CPU (Gloo's one-rank group is timed beside it for scale).

Every figure is the median over the iterations of the slowest rank's time (the ranks
take a MAX of each sample)."""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll
import gcoll.torch as gt
from gcoll._hook import _finite

RANK = int(os.environ.get("GCOLL_RANK", os.environ.get("RANK", "0")))
SIZE = int(os.environ.get("GCOLL_SIZE", os.environ.get("WORLD_SIZE", "1")))


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1].lower()] if s[-1].lower() in mult else int(s)


def slowest(t, group):
    x = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)
    return x.item()


def bench_allreduce(group, nbytes, iters):
    t = torch.ones(max(1, nbytes // 4))
    dist.all_reduce(t, group=group)  # warm-up (connections, buffers)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        samples.append(slowest(time.perf_counter() - t0, group))
    return statistics.median(samples)


def bench_c_call(comm, nbytes, iters, group):
    """gcoll_allreduce itself (blocking, in place) through the ctypes binding."""
    t = torch.ones(max(1, nbytes // 4))
    comm.allreduce(t)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        comm.allreduce(t)
        samples.append(slowest(time.perf_counter() - t0, group))
    return statistics.median(samples)


def bench_overhead(calls):
    """Per-call cost of a 4-byte all_reduce on a group of one rank (no peer, no network:
    what is left is each path's own work and thread hand-offs): the gcoll backend, and
    gcoll_allreduce through ctypes on a communicator of one. Medians of calls timed one
    by one, in microseconds."""
    sub, _ = dist.new_subgroups(group_size=1)  # every rank a group of its own, on gcoll
    gsub, _ = dist.new_subgroups(group_size=1, backend="gloo")  # torch's own path, for scale
    comm = gcoll.Comm(size=1, rank=0, root="127.0.0.1:0")
    t = torch.ones(1)
    out = {}
    for name, fn in (("backend", lambda: dist.all_reduce(t, group=sub)),
                     ("C", lambda: comm.allreduce(t)),
                     ("gloo", lambda: dist.all_reduce(t, group=gsub))):
        for _ in range(100):  # warm-up
            fn()
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        out[name] = statistics.median(samples) * 1e6
    comm.close()
    return out


def bench_ddp(group, steps, hook=None):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10))
    model = DDP(net, process_group=group)
    if hook is not None:
        model.register_comm_hook(*hook(model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(RANK)
    samples = []
    for i in range(steps + 2):
        x = torch.randn(64, 784, generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), torch.zeros(64, dtype=torch.long)).backward()
        opt.step()
        if i >= 2:  # after DDP's bucket rebuild
            samples.append(slowest(time.perf_counter() - t0, group))
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,64k,4m,64m")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000,
                    help="calls timed for the per-call overhead on one rank")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=RANK, world_size=SIZE)
    groups = {"gcoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = {name: [bench_allreduce(g, n, args.iters) for n in sizes] for name, g in groups.items()}
    if "GCOLL_ROOT" in os.environ:  # gcoll-run's GCOLL_RANK/SIZE/ROOT: a communicator of its own
        comm = gcoll.Comm()
    else:  # torchrun: beside its rendezvous port
        comm = gcoll.Comm(size=SIZE, rank=RANK, root="%s:%d" % (
            os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", "29500")) + 7))
    rows["C"] = [bench_c_call(comm, n, args.iters, groups["gloo"]) for n in sizes]
    comm.close()
    if RANK == 0:
        print("all_reduce float32 SUM, %d ranks, median of %d (ms); overhead = gcoll backend "
              "- gcoll_allreduce (us)" % (SIZE, args.iters))
        print("%10s %10s %10s %8s %10s %9s" % ("bytes", "gloo", "gcoll", "gloo/gcoll",
                                                "C call", "overhead"))
        for i, n in enumerate(sizes):
            print("%10d %10.3f %10.3f %8.2f %10.3f %9.1f"
                  % (n, rows["gloo"][i] * 1e3, rows["gcoll"][i] * 1e3,
                     rows["gloo"][i] / rows["gcoll"][i], rows["C"][i] * 1e3,
                     (rows["gcoll"][i] - rows["C"][i]) * 1e6))
    ov = bench_overhead(args.calls)
    worst = {k: slowest(v, groups["gloo"]) for k, v in ov.items()}
    if RANK == 0:
        print("per call, 4 B all_reduce on a group of one rank, median of %d (us, slowest "
              "rank): gcoll backend %.1f, gcoll_allreduce via ctypes %.1f, overhead %.1f; "
              "gloo %.1f" % (args.calls, worst["backend"], worst["C"],
                             worst["backend"] - worst["C"], worst["gloo"]))
    ddp = {name: bench_ddp(g, args.steps) for name, g in groups.items()}

    def hook(model, nonfinite):
        st = gt.GcollHookState("none:ef=0", model=model, nonfinite=nonfinite)
        return st, gt.comm_hook

    hooked = bench_ddp(groups["gcoll"], args.steps, lambda m: hook(m, "raise"))
    if RANK == 0:
        print("DDP step, MLP 784-1024-1024-10 (1.86M parameters), batch 64 (ms): "
              "gloo %.2f, gcoll backend %.2f, gcoll hook 'none' on the gcoll backend %.2f"
              % (ddp["gloo"] * 1e3, ddp["gcoll"] * 1e3, hooked * 1e3))
    # the non-finite check alone: the isfinite scan and the flag allreduce per bucket
    buf = torch.ones(25 << 18)  # a default 25 MB bucket's worth of float32
    samples = []
    flags = torch.zeros(SIZE, dtype=torch.int32)
    for _ in range(args.iters):
        t0 = time.perf_counter()
        flags[RANK] = 0 if _finite(buf) else 1
        dist.all_reduce(flags)
        samples.append(slowest(time.perf_counter() - t0, dist.group.WORLD))
    if RANK == 0:
        print("non-finite check of a 25 MB bucket (scan + flag allreduce): %.3f ms"
              % (statistics.median(samples) * 1e3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
