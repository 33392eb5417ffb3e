#!/usr/bin/python3
# ddp_fashion_mnist.py: DDP on Fashion-MNIST with gloo, PyTorch's hooks and gcoll's hooks.
"""Trains the same MLP (784-256-128-10) with DistributedDataParallel on CPU ranks once per
communication hook, from the same initial weights and data order, and prints accuracy,
bytes sent and time per step for each:

  off       no hook: DDP's own gloo allreduce
  fp16      torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook
  powersgd  PyTorch's PowerSGD hook (rank 2, error feedback, compressing from step 10;
            one bucket, as it broke gloo with several)
  topk      gcoll.torch.comm_hook with topk:density=0.01 (error feedback)
  dgc       gcoll.torch.comm_hook with dgc:density=0.01,momentum=0.9 (momentum correction
            in the codec, so the optimizer runs without momentum)
  sign      gcoll.torch.comm_hook with sign (1 bit per value, error feedback; the
            optimizer runs without momentum: with 0.9 it diverged, see docs/python.md)

Bytes sent per step per rank count everything the rank put on its sockets: gcoll's
counters (bytes_sent) plus gloo's writes, read from /proc/self/io (gloo writes with
writev(2), which wchar counts; gcoll uses sendmsg(2), which it does not).

Run it on 2 local CPU processes (torch.multiprocessing; a Python with torch, such as
.venv/bin/python, and Debian's dataset-fashion-mnist):
    PYTHONPATH=bindings/python GCOLL_LIBRARY=$PWD/.libs/libgcoll.so \\
        .venv/bin/python bindings/python/examples/ddp_fashion_mnist.py
or under gcoll-run, which sets GCOLL_RANK, GCOLL_SIZE, GCOLL_ROOT and a job key (gloo then
rendezvouses at GCOLL_ROOT's port + 1):
    ./tools/gcoll-run -n 2 -x PYTHONPATH=$PWD/bindings/python \\
        .venv/bin/python bindings/python/examples/ddp_fashion_mnist.py
"""

import argparse
import gzip
import os
import secrets
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HOOKS = {
    "off": ("gloo allreduce", None),
    "fp16": ("torch fp16_compress_hook", None),
    "powersgd": ("torch PowerSGD rank 2", None),
    "topk": ("gcoll", "topk:density=0.01"),
    "dgc": ("gcoll", "dgc:density=0.01,momentum=0.9"),
    "sign": ("gcoll", "sign"),
}


def load_idx(path):
    """An IDX file (gzipped): big-endian magic (2 zero bytes, dtype 0x08, ndim), dims."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[0:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(data_dir):
    def part(kind):
        x = load_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % kind))
        y = load_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % kind))
        x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
        return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))

    return part("train"), part("t10k")


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def wchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def run_one(name, args, rank, size, train, test, comm):
    import gcoll.torch as gt
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    bucket_mb = args.bucket_mb
    if name == "powersgd":
        # PowerSGD's hook starts its second allreduce from a future callback on gloo's
        # thread, so with several buckets the ranks can issue them in different orders:
        # gloo then aborted ("op.preamble.length <= op.nbytes") or hung. One bucket.
        bucket_mb = max(bucket_mb, 25.0)
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_mb * 1024 * 1024)
    model = DDP(make_model(), bucket_cap_mb=bucket_mb)
    nparams = sum(p.numel() for p in model.parameters())
    state = None
    momentum = 0.9 if args.momentum is None else args.momentum
    if name == "sign" and args.momentum is None:
        momentum = 0.0  # EF-sign diverged with momentum 0.9 at lr 0.05 (docs/python.md)
    kind, spec = HOOKS[name]
    if name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                       start_powerSGD_iter=10, use_error_feedback=True,
                                       warm_start=True)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    elif spec is not None:
        # model=: compression state per parameter, so a checkpoint continues bit for bit
        state = gt.GcollHookState(spec, comm=comm, model=model)
        model.register_comm_hook(state, gt.comm_hook)
        if spec.startswith("dgc"):
            momentum = 0.0  # DGC's momentum correction replaces the optimizer's
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)

    x_train, y_train = train
    n = min(args.train_samples, len(x_train)) // size * size
    steps = 0
    losses = []
    counters0, wchar0 = comm.counters().bytes_sent, wchar()
    dist.barrier()
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(epoch)
        order = torch.randperm(n, generator=g)[rank::size]  # this rank's shard
        for i in range(0, len(order) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            steps += 1
            if epoch == args.epochs - 1:
                losses.append(loss.item())
            if args.verbose and rank == 0 and steps % 50 == 0:
                print("%s step %d loss %.3f" % (name, steps, loss.item()), flush=True)
    elapsed = time.perf_counter() - t0
    sent = comm.counters().bytes_sent - counters0 + wchar() - wchar0
    if state is not None and hasattr(state, "close"):
        state.close()

    with torch.no_grad():
        x_test, y_test = test
        acc = (model.module(x_test).argmax(1) == y_test).float().mean().item()
    # slowest rank's time, mean bytes over ranks; every rank must hold the same weights
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    stats = torch.tensor([elapsed / steps, sent / steps / size, np.mean(losses), acc])
    wmax, wmin = w.clone(), w.clone()
    dist.all_reduce(wmax, op=dist.ReduceOp.MAX)
    dist.all_reduce(wmin, op=dist.ReduceOp.MIN)
    tmax = stats[:1].clone()
    dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
    dist.all_reduce(stats)
    return {
        "hook": name,
        "how": spec or kind,
        "acc": acc,
        "loss": float(np.mean(losses)),
        "ms": tmax.item() * 1e3,
        "bytes": stats[1].item(),
        "raw": 4 * nparams,
        "steps": steps,
        "same": bool(torch.equal(wmax, wmin)),
        "momentum": momentum,
        "buckets": len(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", "").split()),
    }


def print_table(rows, args, size):
    off = next((r["bytes"] for r in rows if r["hook"] == "off"), None)
    print("Fashion-MNIST MLP (%d params), %d ranks, %d train samples, %d epochs, batch %d "
          "per rank, %d steps" % (rows[0]["raw"] // 4, size, args.train_samples, args.epochs,
                                  args.batch, rows[0]["steps"]))
    print("| hook | compressor | SGD momentum | buckets | test acc | last-epoch loss | ms/step "
          "| KB sent/step/rank | vs off | ranks equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ratio = "%.1fx less" % (off / r["bytes"]) if off and r["hook"] != "off" else "1x"
        print("| %s | %s | %g | %d | %.3f | %.3f | %.2f | %.1f | %s | %s |" % (
            r["hook"], r["how"], r["momentum"], r["buckets"], r["acc"], r["loss"], r["ms"],
            r["bytes"] / 1024, ratio, "yes" if r["same"] else "NO"))
    sys.stdout.flush()


def worker(rank, size, args):
    import gcoll
    import gcoll.torch as gt

    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("gloo", rank=rank, world_size=size)
    comm = gcoll.Comm(size=size, rank=rank, root=gt.default_root())
    train, test = load_fashion_mnist(args.data_dir)
    rows = []
    for name in args.hooks.split(","):
        rows.append(run_one(name, args, rank, size, train, test, comm))
        if rank == 0 and args.verbose:
            print("done:", rows[-1], flush=True)
    if rank == 0:
        print_table(rows, args, size)
    comm.close()
    dist.destroy_process_group()
    if not all(r["same"] for r in rows):
        sys.exit("ranks ended with different weights")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hooks", default=",".join(HOOKS), help="comma list of " + ",".join(HOOKS))
    ap.add_argument("--nproc", type=int, default=2, help="ranks when not under gcoll-run")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=20000, help="first N of 60000")
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=None,
                    help="SGD momentum (default 0.9; 0 for sign; dgc always 0)")
    ap.add_argument("--bucket-mb", type=float, default=0.1, help="DDP bucket cap (MiB)")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--spec", action="append", default=[], metavar="HOOK=SPEC",
                    help="another compressor for a gcoll hook, e.g. sign=sign:chunk=1024")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    for kv in args.spec:
        name, _, spec = kv.partition("=")
        if HOOKS.get(name, ("",))[0] != "gcoll" or not spec:
            ap.error("--spec %r: expected HOOK=SPEC for one of topk, dgc, sign" % kv)
        HOOKS[name] = ("gcoll", spec)
    for name in args.hooks.split(","):
        if name not in HOOKS:
            ap.error("unknown hook %r (%s)" % (name, ",".join(HOOKS)))

    if "GCOLL_RANK" in os.environ:  # under gcoll-run: this process is one rank
        host, port = os.environ["GCOLL_ROOT"].rsplit(":", 1)
        os.environ.setdefault("MASTER_ADDR", host.strip("[]"))
        os.environ.setdefault("MASTER_PORT", str(int(port) + 1))
        worker(int(os.environ["GCOLL_RANK"]), int(os.environ["GCOLL_SIZE"]), args)
        return
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("GCOLL_ROOT", "127.0.0.1:%d" % free_port())
    os.environ.setdefault("GCOLL_JOB_KEY", secrets.token_hex(32))  # shared by the children
    mp.spawn(worker, args=(args.nproc, args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
