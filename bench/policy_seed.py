#!/usr/bin/python3
# bench/policy_seed.py: one rank of the layer-policy comparison (issue 38 item 6); run on
# 2 ranks by bench/policy-seed.sh (gcoll-run, loopback).
"""Trains each model with DistributedDataParallel (the "gcoll" backend) and gcoll's DDP
hook once per row, from the same initial weights and data order, and prints on rank 0 one
line per model, row and seed ("seedpol MODEL ROW seed S: accuracy A, bytes/step B,
identical=0|1"), then one per model and row:

  seedpol MODEL ROW: accuracy A +- H, bytes/step B, vs dense R, identical=0|1, policy P

A is the final test accuracy (the mean over --seeds, H half their spread), B the bytes
the hook's communicator sent per training step and rank (gcoll's bytes_sent, the mean
over the ranks and seeds: what the hook counts; DDP's broadcast of the BatchNorm buffers
and the hook's non-finite flags go through the process group and are not in it, alike
for every row), R = B / dense's B, identical=1 when every seed's ranks end with the same
weights. Then a Markdown table of the same. A row that diverged says "accuracy nan".

Rows (--rows, in this order):
  dense    the hook with spec "none": every gradient reduced uncompressed
  seed     policy="seed" (gcoll.torch's built-in: norms and biases dense, embeddings by
           rows, conv 1%, linear 10%, first and last layers 10%)
  uniform  "*=topk:density=0.01" on every parameter (the default spec, uniformly)
  matched  "*=topk:density=D", D chosen so that the bytes match seed's: two probes of
           2 steps (density 0.01 and 0.1) on fresh copies of the model give bytes per
           step as a line in D (top-k's k is fixed, so its bytes hardly depend on data);
           the first seed's D serves every seed; needs the seed row before it
  default  the hook's defaults (topk:density=0.01, embeddings row-sparse); emb only, as
           on cnn it is uniform's spec
  NAME     --policy NAME=POLICY (repeatable): a layer policy of your own, after the rest

Models (--models):
  cnn  Fashion-MNIST, conv(1->16, 5x5)-BN-ReLU-pool, conv(16->32, 5x5)-BN-ReLU-pool,
       linear 1568->64, ReLU, linear 64->10 (114 k parameters)
  emb  synthetic tokens, topic classification (class Tokens): sequences of --seq tokens
       over a vocabulary of --vocab, 4 labels, each label with its own quarter of the
       vocabulary. nn.Embedding(vocab, 32), mean over the sequence, linear 32->64, ReLU,
       linear 64->4. Fresh batches every step from a seeded generator; a fixed test set
       of 4000 sequences (the first --test-samples of them), on which the Bayes
       classifier's accuracy is printed for reference.

SGD, momentum 0.9, lr --lr-cnn / --lr-emb, batch --batch per rank. Top-k keeps its
error feedback in the hook's states (docs/python.md).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll
import gcoll.torch as gt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_tta import load  # noqa: E402  (the IDX reader of the DDP bench)

ROWS = ("dense", "seed", "uniform", "matched", "default")
CLASSES = 4


def make_cnn(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 64),
                         nn.ReLU(), nn.Linear(64, 10))


class BagOfTokens(nn.Module):
    """Embedding, mean over the sequence, a small MLP."""

    def __init__(self, vocab, dim=32, hidden=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.emb(x).mean(1))))


def make_emb(seed, vocab):
    torch.manual_seed(seed)
    return BagOfTokens(vocab)


class Tokens:
    """The synthetic task (topic classification): a label y of 4 drawn uniformly, then each
    token with probability TOPICAL from y's quarter of the vocabulary (a Zipf(1.1) law
    over it), else from a Zipf(1.1) law over the whole vocabulary (background). Bayes'
    rule reads the label off the topical tokens, so a model that has learned which
    quarter each token is in approaches accuracy 1; rare tokens are what it learns last."""

    TOPICAL = 0.3

    def __init__(self, vocab, seq, seed):
        g = torch.Generator().manual_seed(1000 + seed)
        per = vocab // CLASSES
        zipf = lambda n: torch.arange(1, n + 1, dtype=torch.float64).pow(-1.1)  # noqa: E731
        self.topic = torch.randperm(vocab, generator=g)[:per * CLASSES].view(CLASSES, per)
        self.p_topic = zipf(per) / zipf(per).sum()
        self.background = torch.randperm(vocab, generator=g)
        self.p_background = zipf(vocab) / zipf(vocab).sum()
        self.seq = seq
        self.test = self.draw(4000, g)

    def bayes(self, x, y):
        """The Bayes classifier's accuracy on (x, y) (the task's ceiling): the label
        maximising the likelihood of the sequence's tokens under the mixture above."""
        vocab = len(self.background)
        pb = torch.zeros(vocab, dtype=torch.float64)
        pb[self.background] = self.p_background
        logp = torch.empty(len(y), CLASSES, dtype=torch.float64)
        for c in range(CLASSES):
            pt = torch.zeros(vocab, dtype=torch.float64)
            pt[self.topic[c]] = self.p_topic
            logp[:, c] = torch.log(self.TOPICAL * pt[x] + (1 - self.TOPICAL) * pb[x]).sum(1)
        return (logp.argmax(1) == y).double().mean().item()

    def draw(self, n, g):
        m = n * self.seq
        y = torch.randint(CLASSES, (n,), generator=g)
        topical = torch.rand(m, generator=g) < self.TOPICAL
        t = self.topic[y.repeat_interleave(self.seq),
                       torch.multinomial(self.p_topic, m, replacement=True, generator=g)]
        b = self.background[torch.multinomial(self.p_background, m, replacement=True,
                                              generator=g)]
        return torch.where(topical, t, b).view(n, self.seq), y


CUSTOM = {}  # --policy NAME=POLICY rows


def policy_of(row, density):
    """(spec, policy) the hook is given for a row: given explicitly, so that
    GCOLL_COMPRESSOR and GCOLL_LAYER_POLICY in the environment change nothing."""
    default = "topk:density=0.01"  # the hook's default spec (docs/python.md)
    if row in CUSTOM:
        return default, CUSTOM[row]
    return {"dense": ("none", ""), "seed": (default, "seed"),
            "uniform": (default, "*=topk:density=0.01"),
            "matched": (default, "*=topk:density=%.6g" % density),
            "default": (default, "")}[row]


class Job:
    """One model's data, model factory and batches, the same on every row."""

    def __init__(self, args, kind, data, seed):
        self.kind, self.args, self.seed = kind, args, seed
        self.lr = args.lr_cnn if kind == "cnn" else args.lr_emb
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        if kind == "cnn":
            (self.xtr, self.ytr), (xte, yte) = data
            n = min(len(xte), args.test_samples)
            self.xte, self.yte = xte[:n], yte[:n]
            self.order = torch.randperm(len(self.xtr),
                                        generator=torch.Generator().manual_seed(seed))
        else:
            self.tokens = Tokens(args.vocab, args.seq, seed)
            self.xte, self.yte = self.tokens.test
            n = min(len(self.xte), args.test_samples)
            self.xte, self.yte = self.xte[:n], self.yte[:n]

    def model(self):
        if self.kind == "cnn":
            return make_cnn(self.seed)
        return make_emb(self.seed, self.args.vocab)

    def batches(self):
        """A fresh iterator of this rank's batches (the same sequence for every row)."""
        b, rank, size = self.args.batch, self.rank, self.size
        if self.kind == "cnn":
            step = 0
            while True:
                at = (step * b * size + rank * b) % (len(self.xtr) - b * size)
                idx = self.order[at:at + b]
                yield self.xtr[idx], self.ytr[idx]
                step += 1
        g = torch.Generator().manual_seed(2000 + self.seed)
        while True:  # every rank draws the global batch and keeps its share
            x, y = self.tokens.draw(b * size, g)
            yield x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]


def train(job, row, comm, steps, density=0.0):
    """Trains one row; returns (accuracy, bytes per step, identical, specs)."""
    net = job.model()
    model = DDP(net)
    spec, policy = policy_of(row, density)
    hook = gt.register(model, spec, comm=comm, policy=policy, accumulate_steps=1, adapt="off")
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=0.9)
    data = job.batches()
    specs = hook.specs
    b0 = comm.counters().bytes_sent
    diverged, done = False, 0
    try:
        for _ in range(steps):
            x, y = next(data)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
    except gt.NonFiniteError:  # raised on every rank alike: the row diverged
        diverged = True
    finally:
        hook.close()  # waits for the buckets in flight
    # the mean over the ranks (a sparse allreduce's ranks need not send alike), so that
    # every rank reports, and matches a density to, the same figure
    sent = torch.tensor([float(comm.counters().bytes_sent - b0)], dtype=torch.float64)
    dist.all_reduce(sent)
    sent = sent.item() / job.size
    acc = float("nan") if diverged else evaluate(job, net)
    w = torch.cat([p.detach().flatten() for p in net.parameters()])
    ws = [torch.empty_like(w) for _ in range(job.size)]
    dist.all_gather(ws, w)
    return acc, sent / max(1, done), int(all(torch.equal(w, v) for v in ws)), specs


def evaluate(job, net):
    """Each rank its slice of the test set; the counts summed."""
    net.eval()
    n = len(job.xte)
    lo, hi = job.rank * n // job.size, (job.rank + 1) * n // job.size
    correct = 0
    with torch.no_grad():
        for i in range(lo, hi, 500):
            j = min(hi, i + 500)
            correct += int((net(job.xte[i:j]).argmax(1) == job.yte[i:j]).sum())
    c = torch.tensor([correct], dtype=torch.int64)
    dist.all_reduce(c)
    return c.item() / n


def match_density(job, comm, target, steps=2):
    """Top-k's density whose bytes per step equal target: bytes at 0.01 and 0.1 on a
    scratch run of a few steps, then the line through them (clamped to (0, 1])."""
    lo, hi = 0.01, 0.1
    b_lo = train(job, "matched", comm, steps, lo)[1]
    b_hi = train(job, "matched", comm, steps, hi)[1]
    d = lo + (target - b_lo) * (hi - lo) / (b_hi - b_lo)
    return float("%.3g" % min(1.0, max(1e-4, d)))


def summary(kind, row, runs, dense, policy):
    """The row's line: accuracy as the mean over the seeds +- half their spread."""
    accs = [r[0] for r in runs]
    nbytes = sum(r[1] for r in runs) / len(runs)
    ratio = "%.4f" % (nbytes / dense) if dense else "-"
    half = (max(accs) - min(accs)) / 2
    mean = sum(accs) / len(accs)
    return ("seedpol %s %s: accuracy %.4f +- %.4f, bytes/step %.0f, vs dense %s, identical=%d, "
            "policy %s" % (kind, row, mean, half, nbytes, ratio, min(r[2] for r in runs), policy),
            (kind, row, policy, mean, half, nbytes, ratio))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="cnn,emb")
    ap.add_argument("--rows", default="dense,seed,uniform,matched,default")
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=POLICY",
                    help="one more row: the hook with this layer policy (repeatable)")
    ap.add_argument("--steps", type=int, default=500, help="training steps per row")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--lr-cnn", type=float, default=0.05)
    ap.add_argument("--lr-emb", type=float, default=0.2)
    ap.add_argument("--seeds", default="1", help="comma-separated: weights, data order, "
                    "token task; accuracy is the mean over them +- half the spread")
    ap.add_argument("--vocab", type=int, default=5000)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--test-samples", type=int, default=10000)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    models, rows = args.models.split(","), args.rows.split(",")
    try:
        seeds = [int(v) for v in args.seeds.split(",")]
    except ValueError:
        ap.error("--seeds: expected integers separated by commas, got %r" % args.seeds)
    for m in models:
        if m not in ("cnn", "emb"):
            ap.error("unknown model %r (cnn, emb)" % m)
    for r in rows:
        if r not in ROWS:
            ap.error("unknown row %r (%s)" % (r, ", ".join(ROWS)))
    for text in args.policy:
        name, eq, pol = text.partition("=")
        if not eq or not name or not pol or name in ROWS or name in CUSTOM or " " in name:
            ap.error("--policy %r: expected NAME=POLICY with a new row name" % text)
        CUSTOM[name] = pol
        rows.append(name)
    if "matched" in rows and ("seed" not in rows or rows.index("seed") > rows.index("matched")):
        ap.error("the matched row needs the seed row before it")
    if args.steps < 1 or args.batch < 1 or args.vocab < CLASSES or args.seq < 1:
        ap.error("--steps, --batch and --seq must be >= 1, --vocab >= %d" % CLASSES)
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    # one communicator for every row's hook; each row counts its own bytes
    comm = gcoll.Comm(size=dist.get_world_size(), rank=dist.get_rank(), root=gt.default_root())
    rank0 = dist.get_rank() == 0
    fm = (load(args.data, "train"), load(args.data, "t10k")) if "cnn" in models else None
    table = []
    for kind in models:
        runs = {row: [] for row in rows}
        density = None  # the matched row's, from the first seed's bytes
        for seed in seeds:
            job = Job(args, kind, fm, seed)
            if kind == "emb" and rank0:
                print("seedpol emb bayes seed %d: the Bayes classifier's test accuracy %.4f"
                      % (seed, job.tokens.bayes(job.xte, job.yte)), flush=True)
            for row in rows:
                if row == "default" and kind == "cnn":
                    continue  # without an embedding the hook's default is uniform's spec
                if row == "matched" and density is None:
                    density = match_density(job, comm, runs["seed"][0][1])
                acc, nbytes, same, specs = train(job, row, comm, args.steps, density or 0.0)
                runs[row].append((acc, nbytes, same))
                if rank0:
                    print("seedpol %s %s seed %d: accuracy %.4f, bytes/step %.0f, identical=%d"
                          % (kind, row, seed, acc, nbytes, same), flush=True)
                    if os.environ.get("SEEDPOL_SPECS"):
                        for n, sp in specs.items():
                            print("  %s: %s" % (n, sp), flush=True)
        dense = sum(r[1] for r in runs["dense"]) / len(seeds) if "dense" in rows else None
        for row in rows:
            if not runs[row]:
                if rank0:
                    print("seedpol %s %s: not run (no embedding: the same specs as uniform)"
                          % (kind, row), flush=True)
                continue
            spec, policy = policy_of(row, density or 0.0)
            what = "spec none" if spec == "none" else (policy or "(hook default)")
            line, entry = summary(kind, row, runs[row], dense, what)
            table.append(entry)
            if rank0:
                print(line, flush=True)
    if rank0:
        print("\n| model | row | policy | test accuracy | bytes/step/rank | vs dense |")
        print("| --- | --- | --- | --- | --- | --- |")
        for kind, row, what, mean, half, nbytes, ratio in table:
            print("| %s | %s | `%s` | %.4f +- %.4f | %.0f | %s |" % (kind, row, what, mean, half,
                                                                    nbytes, ratio))
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
