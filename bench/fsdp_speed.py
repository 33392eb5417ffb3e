#!/usr/bin/python3
# bench/fsdp_speed.py: one rank of bench/fsdp-speed.sh (issue 37 item 4).
"""Steps per second of dense FSDP2 on the gcoll backend against FSDP2 with
gcoll.torch.fsdp_compress (--spec: DGC 1% gradients by default, a quantized all-gather),
and the loss after --steps steps of each, with a breakdown of where each step's time goes.

The models (--rows) are built from the same initial weights (784-W-W-10 MLP,
fully_shard per Linear and on the root) and trained on the same batches (Fashion-MNIST
where --data has it, else labels from a fixed random linear map of Gaussian inputs), one
step of each in turn, so that all see the
same load on a shared machine and their ratio holds within the run; the first --warm steps
are not timed. Prints on rank 0:

  fsdp-speed ROW: S steps/s, loss after N steps L, MB/step M
  fsdp-speed ratio ROW: R (steps/s over dense's); loss D% of dense's
  breakdown ROW: step X ms = reduce-scatter A ms (C calls) + all-gather B ms (D calls)
                 + rest (compute, FSDP2, optimizer) E ms
  cpu ROW: the same in CPU time of the process (all threads), which load does not inflate
  compute: forward+backward+step of the unsharded model alone X ms (Y ms of CPU)
  idle projection ROW: CPU + bytes / --rate per step, and the ratio of the projections
  codec: ... (encode/decode of one step's messages, measured alone)

MB/step: what this rank sent per step (gcoll's bytes_sent, backend and compress communicators).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import gcoll.torch as gt
from gcoll.compress import Compressor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                    DefaultReduceScatter)


def make_model(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, 10))


class Timer:
    """Wall time, CPU time of the process (every thread: gcoll's progress threads too)
    and calls of a wrapped function."""

    def __init__(self):
        self.s, self.cpu, self.calls = 0.0, 0.0, 0

    def wrap(self, fn):
        def timed(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.s += time.perf_counter() - t0
                self.cpu += time.process_time() - c0
                self.calls += 1
        return timed


def rate_bytes(rate):
    """tc's rate ("1gbit", "100mbit") in bytes per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f / 8
    raise ValueError("rate %r: expected a number and kbit, mbit or gbit" % rate)


class TimedAG(DefaultAllGather):
    def __init__(self, t):
        self.t = t

    def __call__(self, *a, **k):
        k["async_op"] = False  # timed where it runs (CPU: FSDP2 waits at once anyway)
        return self.t.wrap(super().__call__)(*a, **k)


class TimedRS(DefaultReduceScatter):
    def __init__(self, t):
        self.t = t

    def __call__(self, *a, **k):
        k["async_op"] = False
        return self.t.wrap(super().__call__)(*a, **k)


def shard(net, mesh):
    for layer in net.modules():
        if layer is not net and any(True for _ in layer.parameters(recurse=False)):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=3,
                    help="the first steps, not timed (of --steps, which all train)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--spec", default="dgc:density=0.01,momentum=0.9")
    ap.add_argument("--allgather", default="mxfp8:format=e4m3")
    ap.add_argument("--warmup", type=int, default=0,
                    help="fsdp_compress's warm-up of the sparsifier, in steps")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="Fashion-MNIST's directory (synthetic data where it is missing)")
    ap.add_argument("--rate", default="1gbit", help="the links' rate (for the projection)")
    ap.add_argument("--rows", default="dense,compressed",
                    help="dense, compressed (fsdp_compress), compressed-noreuse (the same "
                    "with allgather_reuse=False)")
    ap.add_argument("--reshard", type=int, default=1,
                    help="reshard_after_forward of the layers (1: FSDP2's default)")
    args = ap.parse_args()
    if not 0 <= args.warm < args.steps:
        ap.error("--warm must be in [0, --steps)")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=rank, world_size=size)
    mesh = init_device_mesh("cpu", (size,))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))

    def build(kind, index):
        compressed = kind != "dense"
        net = make_model(args.width)
        for layer in net.modules():
            if layer is not net and any(True for _ in layer.parameters(recurse=False)):
                fully_shard(layer, mesh=mesh, reshard_after_forward=bool(args.reshard))
        model = fully_shard(net, mesh=mesh)
        rs, ag = Timer(), Timer()
        state = None
        if compressed:
            root = "%s:%d" % (os.environ["MASTER_ADDR"],
                              int(os.environ["MASTER_PORT"]) + 1 + index)
            state = gt.fsdp_compress(model, args.spec, allgather=args.allgather or None,
                                     root=root, allgather_reuse=kind == "compressed",
                                     warmup=args.warmup)
            state._reduce_scatter = rs.wrap(state._reduce_scatter)
            if args.allgather:
                state._all_gather = ag.wrap(state._all_gather)
            else:
                for m in model.modules():
                    if hasattr(m, "set_custom_all_gather"):
                        m.set_custom_all_gather(TimedAG(ag))
        else:
            for m in model.modules():
                if hasattr(m, "set_custom_reduce_scatter"):
                    m.set_custom_reduce_scatter(TimedRS(rs))
                    m.set_custom_all_gather(TimedAG(ag))
        # DGC's momentum correction replaces the optimizer's momentum (Lin et al. 2018)
        dgc = compressed and args.spec.startswith("dgc")
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0 if dgc else 0.9)
        return dict(model=model, opt=opt, state=state, rs=rs, ag=ag, secs=0.0, cpu=0.0,
                    bytes=0, loss=None)

    names = args.rows.split(",")
    for name in names:
        if name not in ("dense", "compressed", "compressed-noreuse"):
            ap.error("unknown row %r" % name)
    rows = {name: build(name, i) for i, name in enumerate(names)}

    if os.path.exists(os.path.join(args.data, "train-images-idx3-ubyte.gz")):
        # Fashion-MNIST, each rank its own slice of a fixed shuffled order (as ddp_tta.py)
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from ddp_tta import load

        (xtr, ytr), (xte, yte) = load(args.data, "train"), load(args.data, "t10k")
        xtr, xte = xtr.flatten(1), xte.flatten(1)
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(1))
        data = []
        for i in range(args.steps):
            idx = order[(i * size + rank) * args.batch:(i * size + rank + 1) * args.batch]
            data.append((xtr[idx], ytr[idx]))
        xe, ye = xte[:2000], yte[:2000]
        what = "Fashion-MNIST"
    else:  # labels from a fixed random linear map of Gaussian inputs
        g = torch.Generator().manual_seed(1 + rank)
        w_true = torch.randn(784, 10, generator=torch.Generator().manual_seed(7))
        data = [torch.randn(args.batch, 784, generator=g) for _ in range(args.steps)]
        data = [(x, (x @ w_true).argmax(1)) for x in data]
        xe = torch.randn(2000, 784, generator=torch.Generator().manual_seed(99))
        ye = (xe @ w_true).argmax(1)
        what = "synthetic data"

    def sent(r):
        n = backend.counters()["bytes_sent"]
        if r["state"] is not None:
            n += r["state"].counters().bytes_sent
        return n

    def step(r, x, y, timed):
        dist.barrier()
        b0, t0, c0 = sent(r), time.perf_counter(), time.process_time()
        r["opt"].zero_grad()
        loss = nn.functional.cross_entropy(r["model"](x), y)
        loss.backward()
        r["opt"].step()
        if timed:
            r["secs"] += time.perf_counter() - t0
            r["cpu"] += time.process_time() - c0
            r["bytes"] += sent(r) - b0
        return loss

    for i, (x, y) in enumerate(data):
        timed = i >= args.warm
        if i == args.warm:
            for r in rows.values():
                r["rs"].__init__()
                r["ag"].__init__()
        # each step the rows in turn, starting one further each time
        for name in names[i % len(names):] + names[:i % len(names)]:
            step(rows[name], x, y, timed)
    # the loss after the steps on 2,000 held-out samples, averaged over the ranks
    n = args.steps - args.warm  # timed steps
    out = ["# %s, %d x %d samples a step" % (what, size, args.batch)]
    for name, r in rows.items():
        with torch.no_grad():
            le = nn.functional.cross_entropy(r["model"](xe), ye).detach().reshape(1)
        dist.all_reduce(le)
        r["loss"] = le.item() / size
        out.append("fsdp-speed %s: %.2f steps/s, loss after %d steps %.4f, MB/step %.3f" %
                   (name, n / r["secs"], args.steps, r["loss"], r["bytes"] / n / 1e6))
    d = rows.get("dense")
    for name, c in rows.items():
        if d is not None and c is not d:
            out.append("fsdp-speed ratio %s: %.2f (steps/s over dense's); loss %+.1f%% of "
                       "dense's" % (name, d["secs"] / c["secs"],
                                    100 * (c["loss"] / d["loss"] - 1)))
    for name, r in rows.items():
        ms = 1e3 / n
        out.append("breakdown %s: step %.1f ms = reduce-scatter %.1f ms (%d calls) + all-gather "
                   "%.1f ms (%d calls) + rest (compute, FSDP2, optimizer) %.1f ms" %
                   (name, r["secs"] * ms, r["rs"].s * ms, r["rs"].calls // n, r["ag"].s * ms,
                    r["ag"].calls // n, (r["secs"] - r["rs"].s - r["ag"].s) * ms))
        out.append("cpu %s: %.1f ms of CPU a step = reduce-scatter %.1f + all-gather %.1f + "
                   "rest %.1f" % (name, r["cpu"] * ms, r["rs"].cpu * ms, r["ag"].cpu * ms,
                                  (r["cpu"] - r["rs"].cpu - r["ag"].cpu) * ms))

    # compute alone: the unsharded model, same batch, no communication
    net = make_model(args.width)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    t0, c0 = time.perf_counter(), time.process_time()
    for x, y in data[:10]:
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    out.append("compute: forward+backward+step of the unsharded model alone %.1f ms (%.1f ms "
               "of CPU)" % ((time.perf_counter() - t0) * 100, (time.process_time() - c0) * 100))
    # on an idle machine FSDP2 on CPU runs its collectives in line (no streams): a step
    # takes about its CPU time plus the time its bytes take on the link (no overlap), and
    # at least the larger of the two
    bps = rate_bytes(args.rate)
    proj = {}
    for name, r in rows.items():
        cpu, wire = r["cpu"] / n, r["bytes"] / n / bps
        proj[name] = (cpu + wire, max(cpu, wire))
        out.append("idle projection %s: CPU %.1f ms + wire %.1f ms (%.2f MB at %s) = %.1f ms a "
                   "step (at least %.1f)" % (name, cpu * 1e3, wire * 1e3, r["bytes"] / n / 1e6,
                                             args.rate, proj[name][0] * 1e3, proj[name][1] * 1e3))
    if "dense" in proj:
        for name in proj:
            if name != "dense":
                out.append("idle projection ratio %s: %.2f (between %.2f and %.2f)" % (
                    name, proj["dense"][0] / proj[name][0],
                    proj["dense"][1] / proj[name][0], proj["dense"][0] / proj[name][1]))

    # the codecs alone, on one step's sizes: top-k of each module's flat gradient, the
    # all-gather codec on each shard
    sizes = [sum(p.numel() for p in m.parameters()) for m in net
             if any(True for _ in m.parameters())]
    topk, agc = Compressor(args.spec), Compressor(args.allgather) if args.allgather else None
    t_enc = t_agenc = t_agdec = 0.0
    # a state only where the codec needs one (dgc); top-k without its feedback
    states = {s: topk.state(s) for s in sizes} if topk.needs_state else {}
    reps = 3
    for _ in range(reps):
        for s in sizes:
            v = torch.randn(s)
            t0 = time.perf_counter()
            topk.encode(v, states.get(s))
            t_enc += time.perf_counter() - t0
            if agc is not None:
                sh = v[: (s + size - 1) // size].contiguous()
                t0 = time.perf_counter()
                msg = agc.encode(sh)
                t_agenc += time.perf_counter() - t0
                t0 = time.perf_counter()
                agc.decode(msg, torch.empty_like(sh))
                t_agdec += time.perf_counter() - t0
    out.append("codec: top-k select+encode of every module's full gradient %.1f ms/step; "
               "all-gather encode of the shards %.1f ms, decode of one rank's shards %.1f ms "
               "(x%d ranks, x2 if resharded)" % (t_enc * 1e3 / reps, t_agenc * 1e3 / reps,
                                                 t_agdec * 1e3 / reps, size))
    for name, r in rows.items():
        if r["state"] is not None:
            out.append("counters %s: %s, all-gathers reused %d" % (
                name, r["state"].counters(), r["state"].allgather_reused))
    if rank == 0:
        print("\n".join(out), flush=True)
    for r in rows.values():
        if r["state"] is not None:
            r["state"].close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
