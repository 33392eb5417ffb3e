#!/usr/bin/python3
# bench/ddp_tta.py: one rank of a DDP time-to-accuracy run (bench/ddp-tta.sh starts four).
"""Trains one model with DistributedDataParallel on Fashion-MNIST once per way of reducing
gradients (--rows, in turn, from the same initial weights and data order), and writes, on
rank 0, OUT/MODEL-ROW.dat: one line per evaluation, "step seconds accuracy
bytes_per_step", seconds being training time only (the clock stops while the ranks
evaluate), then "final step seconds accuracy bytes_per_step identical=0|1" (accuracy nan and
"diverged" at the end when a gradient became NaN/Inf at that step). The process
group is the gcoll backend, with a Gloo group beside it for the Gloo rows.

Rows:
  gloo      DDP on a Gloo process group, no hook (also measures the share of its step
            spent communicating: OUT/MODEL-gloo.comm)
  gloo-fp16 DDP on Gloo with torch's fp16_compress_hook (the 16-bit baseline)
  gcoll     DDP on the "gcoll" backend, no hook
  fp16      the gcoll hook with fp16 (on the gcoll backend)
  topk      the gcoll hook with topk:density=0.01 (error feedback)
  dgc       the gcoll hook with dgc:density=D,momentum=0.9 (D: --dgc-density, 0.01) and
            a warm-up of --dgc-warmup steps (0: none), the optimizer then without momentum
            (DGC's momentum correction replaces it), with DGC's layer rule as its layer
            policy: the last layer and tensors of at most 2/density elements dense (Lin et
            al. 2018; as gcoll-train does for a DGC compressor). Lin et al. warm up over 4
            of 90 epochs at 0.1%; this run is a fifth of an epoch, and at 1% the warm-up's
            dense-ish first steps cost more time than they save here
  powersgd  torch's PowerSGD hook (rank 4, error feedback, warm start) on Gloo
  fsdp      FSDP2 (fully_shard per layer and on the model) on the "gcoll" backend
  fsdp-topk the same with gcoll.torch.fsdp_compress: topk:density=0.01 gradients
            reduce-scattered by gcoll, a bf16 all-gather of the parameters (qwZ)

Models (--model): cnn (2 conv layers, 0.1M parameters) or mlp (784-W-W-10, W=--width).

Bytes per step are per rank: gcoll's bytes_sent (backend and hook communicators) plus
what the process wrote through write/writev (Gloo's sockets), from /proc/self/io's wchar,
counted over the training steps only.
"""

import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll.torch as gt

ROWS = ("gloo", "gloo-fp16", "gcoll", "fp16", "topk", "dgc", "powersgd", "fsdp", "fsdp-topk")


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[0:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, kind):
    x = load_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % kind))
    y = load_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % kind))
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def make_model(kind, width):
    torch.manual_seed(0)
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(),
                             nn.Linear(64, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, 10))


def wchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def run(args, model_kind, row, index, data, gloo):
    """Trains one row; returns rank 0's lines."""
    rank, size = dist.get_rank(), dist.get_world_size()
    (xtr, ytr), (xte, yte) = data
    on_gloo = row in ("gloo", "gloo-fp16", "powersgd")
    pg = gloo if on_gloo else None
    net = make_model(model_kind, args.width)
    cap = 25
    fsdp = row.startswith("fsdp")
    if row == "powersgd":
        # PowerSGD's hook starts each bucket's second allreduce from a future callback on
        # Gloo's thread, so with several buckets the ranks can issue them in different
        # orders (docs/python.md): one bucket
        cap = max(cap, sum(p.numel() for p in net.parameters()) * 4 / 2**20 + 1)
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(cap * 2**20)
    momentum = 0.9
    hook = None
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (size,))
        for layer in net.modules():
            if layer is not net and any(True for _ in layer.parameters(recurse=False)):
                fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
        if row == "fsdp-topk":
            root = "%s:%d" % (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1 + index)
            hook = gt.fsdp_compress(model, "topk:density=0.01", allgather="bf16", root=root)
    else:
        model = DDP(net, bucket_cap_mb=cap, process_group=pg)
    if row == "gloo-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    elif row in ("fp16", "topk", "dgc"):
        spec = {"fp16": "fp16", "topk": "topk:density=0.01",
                "dgc": "dgc:density=%g,momentum=0.9,warmup_steps=%d" % (args.dgc_density, args.dgc_warmup)}[row]
        root = "%s:%d" % (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1 + index)
        policy = None
        if row == "dgc":
            policy = "last=none;size<2001=none;*=" + spec
        hook = gt.register(model, spec, root=root, policy=policy)
        if row == "dgc":
            momentum = 0.0
    elif row == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        psgd = powersgd.PowerSGDState(process_group=gloo, matrix_approximation_rank=4,
                                      start_powerSGD_iter=2, use_error_feedback=True,
                                      warm_start=True)
        model.register_comm_hook(psgd, powersgd.powerSGD_hook)
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 20  # torch's default, for the next rows
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(1))

    def batch(step):  # rank's share of the global batch of this step
        at = (step * args.batch * size + rank * args.batch) % (len(xtr) - args.batch * size)
        idx = order[at:at + args.batch]
        return xtr[idx], ytr[idx]

    def evaluate(n):  # each rank its slice of the first n test images; counts summed
        model.eval()
        lo, hi = rank * n // size, (rank + 1) * n // size
        with torch.no_grad():
            correct = 0
            for i in range(lo, hi, 500):
                j = min(hi, i + 500)
                # FSDP2 all-gathers in forward: every rank runs as many batches
                out = (model if fsdp else model.module)(xte[i:j])
                correct += int((out.argmax(1) == yte[i:j]).sum())
        model.train()
        c = torch.tensor([correct], dtype=torch.int64)
        dist.all_reduce(c)
        return c.item() / n

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))

    def sent():  # everything this process put on sockets: Gloo's writes, gcoll's sends
        n = wchar() + backend.counters()["bytes_sent"]
        if hook is not None:
            n += hook.counters().bytes_sent
        return n

    lines = []
    train_s, nbytes = 0.0, 0
    for step in range(1, args.steps + 1):
        x, y = batch(step)
        b0, t0 = sent(), time.perf_counter()
        opt.zero_grad()
        try:
            nn.functional.cross_entropy(model(x), y).backward()
        except gt.NonFiniteError:  # raised on every rank alike: the row diverged
            lines.append("final %d %.3f nan %.0f identical=1 diverged" % (
                step, train_s, nbytes / max(1, step - 1)))
            hook.close()
            return lines
        opt.step()
        train_s += time.perf_counter() - t0
        nbytes += sent() - b0
        if step % args.eval_every == 0 or step == args.steps:
            acc = evaluate(len(xte) if step == args.steps else args.eval_samples)
            lines.append("%d %.3f %.4f %.0f" % (step, train_s, acc, nbytes / step))
            if rank == 0:
                print(model_kind, row, lines[-1], flush=True)
    if row == "gloo":
        lines.append(comm_share(model, opt, batch, args.steps))
    # the ranks end with the same weights (DDP's and the hooks' promise)
    w = torch.cat([(p.detach().full_tensor() if fsdp else p.detach()).flatten()
                   for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(size)]
    dist.all_gather(ws, w)
    same = all(torch.equal(w, v) for v in ws)
    lines.append("final %d %.3f %.4f %.0f identical=%d" % (args.steps, train_s, acc,
                                                           nbytes / args.steps, same))
    if hook is not None:
        hook.close()
    return lines


def comm_share(model, opt, batch, steps, n=10):
    """"commshare C": the share of a DDP step spent communicating, 1 - (n steps under
    no_sync, computing alone) / (n synchronised steps); the weights are restored after."""
    saved = [p.detach().clone() for p in model.parameters()]
    state = opt.state_dict()
    times = {}
    for sync in (True, False):
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(n):
            x, y = batch(steps + 1 + i)
            opt.zero_grad()
            if sync:
                nn.functional.cross_entropy(model(x), y).backward()
            else:
                with model.no_sync():
                    nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        times[sync] = time.perf_counter() - t0
    with torch.no_grad():
        for p, q in zip(model.parameters(), saved):
            p.copy_(q)
    opt.load_state_dict(state)
    return "commshare %.3f" % max(0.0, 1 - times[False] / times[True])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--model", default="mlp", choices=["cnn", "mlp"])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-samples", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--dgc-warmup", type=int, default=0,
                    help="DGC's density warm-up in steps (exponential, as Lin et al. 2018)")
    ap.add_argument("--dgc-density", type=float, default=0.01,
                    help="DGC's density after the warm-up")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default=".", help="directory of rank 0's MODEL-ROW.dat files")
    args = ap.parse_args()
    rows = args.rows.split(",")
    for r in rows:
        if r not in ROWS:
            ap.error("unknown row %r (%s)" % (r, ", ".join(ROWS)))
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=rank, world_size=size)
    gloo = dist.new_group(backend="gloo")
    data = load(args.data, "train"), load(args.data, "t10k")
    for i, row in enumerate(rows):
        lines = run(args, args.model, row, i, data, gloo)
        if rank == 0:
            print(args.model, row, lines[-1], flush=True)
            with open(os.path.join(args.out, "%s-%s.dat" % (args.model, row)), "w") as f:
                f.write("\n".join(lines) + "\n")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
