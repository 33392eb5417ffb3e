# test_hook_features.py: the DDP hook's layer policy, default spec, warm-up, accumulation,
# float16/bfloat16 buckets and bucket rebuild, on 2+ ranks (gloo process group beside it).
"""Run: gcoll-run -n 2 python3 test_hook_features.py. gloo rendezvous through a FileStore
at $GCOLL_TEST_STORE (default: a file named after GCOLL_ROOT's port in $TMPDIR or /tmp).

Every reduced bucket is checked against a replay: the binding's blocking
compressed_allreduce (or dense allreduce for "none") of each parameter's slice of the
same inputs, with one fresh TensorState per parameter of the spec the parameter should
have got, kept across steps. A hook that chose another spec, selected across a bucket
instead of per parameter, lost a state when DDP rebuilt its buckets or skipped the
warm-up would differ from it."""

import os
import tempfile
import unittest

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll
import gcoll.torch as gt

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])


def setUpModule():
    store = os.environ.get("GCOLL_TEST_STORE") or os.path.join(
        tempfile.gettempdir(), "gcoll-hookf-store-" + os.environ["GCOLL_ROOT"].rsplit(":", 1)[1])
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    for k in ("GCOLL_COMPRESSOR", "GCOLL_LAYER_POLICY", "GCOLL_ACCUMULATE_STEPS", "GCOLL_ADAPT"):
        os.environ.pop(k, None)
    # the gcoll backend where it is built (Gloo has no bfloat16 broadcast, which DDP needs)
    if gt.backend_available() and "MASTER_PORT" in os.environ:
        dist.init_process_group("gcoll", rank=RANK, world_size=SIZE)
    else:
        dist.init_process_group("gloo", init_method="file://" + store, rank=RANK,
                                world_size=SIZE)


def tearDownModule():
    dist.destroy_process_group()


class HalfLinear(nn.Module):
    """A linear layer whose parameters are float16/bfloat16 (so are their gradients and
    DDP's buckets) and whose arithmetic is float32 (CPU matmul of halves is not in 1.13)."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        lin = nn.Linear(n_in, n_out)
        self.weight = nn.Parameter(lin.weight.detach().to(dtype))
        self.bias = nn.Parameter(lin.bias.detach().to(dtype))

    def forward(self, x):
        return x @ self.weight.float().t() + self.bias.float()


def make_model(seed=0, dtype=None):
    torch.manual_seed(seed)
    if dtype is None:
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                            nn.Linear(64, 10))
    else:
        net = nn.Sequential(HalfLinear(32, 64, dtype), nn.ReLU(), HalfLinear(64, 64, dtype),
                            nn.ReLU(), HalfLinear(64, 10, dtype))
    # DDP's first step has one bucket of everything (beyond a first bucket of 1 KB), then
    # DDP rebuilds them in the order gradients became ready: two or three buckets, each of
    # several parameters
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    return DDP(net, bucket_cap_mb=0.02)


def batches(steps, n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 10, generator=g)
    g_rank = torch.Generator().manual_seed(seed * 1000 + RANK)
    for _ in range(steps):
        x = torch.randn(n, 32, generator=g_rank)
        yield x, (x @ teacher).argmax(1)


def flat_params(model):
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


class Mixed(nn.Module):
    """An embedding of token ids drawn from the input, a convolution with batch norm, and
    a linear head: one of each module class the seed's policy treats differently."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 8)
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4 * 32 + 8, 10)

    def forward(self, x):
        ids = (x[:, :4].abs() * 10).long().clamp(max=39)
        h = torch.relu(self.bn(self.conv(x.unsqueeze(1)))).flatten(1)
        return self.fc(torch.cat([h, self.emb(ids).mean(1)], 1))


def make_mixed(seed=0):
    torch.manual_seed(seed)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    return DDP(Mixed(), bucket_cap_mb=0.02)


class TestHookFeatures(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.comm = gcoll.Comm(size=SIZE, rank=RANK)  # root from GCOLL_ROOT

    @classmethod
    def tearDownClass(cls):
        cls.comm.close()

    def capture(self, model, state):
        """Registers comm_hook through a wrapper that logs, per bucket, (step, parameter
        names, input, output); returns the log."""
        names = {id(p): n for n, p in model.named_parameters()}
        log = []

        def hook(st, bucket):
            inp = bucket.buffer().clone()
            params = [names[id(p)] for p in bucket.parameters()]
            step = st.step + (bucket.index() == 0)
            fut = gt.comm_hook(st, bucket)

            def record(f):
                log.append((step, params, inp, f.value().clone()))
                return f.value()

            return fut.then(record)

        model.register_comm_hook(state, hook)
        return log

    def train(self, model, steps, lr=0.1, seed=1):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for x, y in batches(steps, seed=seed):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    def replay(self, log, model, specs, accumulate=1, adapt=None, adapted=()):
        """Recomputes every logged bucket per parameter with fresh states of specs[name]
        (those named in adapted each with its own controller of rules adapt); asserts bit
        equality.
        Returns the steps' bucket layouts."""
        sizes = {n: p.numel() for n, p in model.named_parameters()}
        comps = {s: gcoll.Compressor(s) for s in set(specs.values()) if s != "none"}
        fresh = {n: comps[s].state(sizes[n]) for n, s in specs.items() if s != "none"}
        ctls = []
        for n in sorted(adapted):
            ctls.append(gcoll.Adapt(self.comm, adapt))
            ctls[-1].attach(fresh[n])
            if adapt and "budget" in adapt and len(ctls) > 1:
                ctls[-1].join(ctls[0])  # one budget, as the hook's (two members: any order)
        acc = {n: torch.zeros(sizes[n]) for n in specs}
        layouts = {}
        for step, params, inp, out in log:
            layouts.setdefault(step, []).append(params)
            reduced = step % accumulate == 0
            off = 0
            for n in params:
                x = inp[off:off + sizes[n]].float() + acc[n]
                got = out[off:off + sizes[n]]
                if not reduced:
                    acc[n] = x
                    self.assertTrue(bool((got == 0).all()), "step %d %s not zero" % (step, n))
                else:
                    acc[n] = torch.zeros(sizes[n])
                    ref = np.empty(sizes[n], np.float32)
                    if specs[n] == "none":
                        self.comm.allreduce(x.numpy(), ref, op="avg")
                    else:
                        self.comm.compressed_allreduce(fresh[n], x.numpy(), ref, op="avg")
                    ref = torch.from_numpy(ref).to(out.dtype)
                    self.assertTrue(torch.equal(got, ref), "step %d parameter %s (%s)"
                                    % (step, n, specs[n]))
                off += sizes[n]
        for n, st in fresh.items():
            self.assertEqual(self.hook.states[n].step, st.step, n)
        for c in ctls:
            c.close()
        return layouts

    def assert_same_densities(self, dens):
        """Every rank's controllers decided these densities."""
        mine = torch.tensor(dens, dtype=torch.float64)
        everyone = torch.empty(SIZE * mine.numel(), dtype=torch.float64)
        self.comm.allgather(mine, everyone)
        for q in range(SIZE):
            self.assertTrue(torch.equal(everyone[q * mine.numel():(q + 1) * mine.numel()],
                                        mine), "rank %d decided other densities" % q)

    def assert_same_weights(self, model):
        w = flat_params(model)
        everyone = torch.empty(SIZE * w.numel())
        self.comm.allgather(w, everyone)
        for q in range(SIZE):
            self.assertTrue(torch.equal(everyone[q * w.numel():(q + 1) * w.numel()], w),
                            "rank %d's weights differ from rank %d's" % (q, RANK))

    def test_policy_and_bucket_rebuild(self):
        """Per-parameter specs from the layer policy (first/last layers, size and name
        rules) inside DDP's multi-parameter buckets; the states follow the parameters
        through DDP's bucket rebuild."""
        model = make_model()
        policy = "*bias*=none;first=topk:density=0.5;last=sign;*=topk:density=0.05"
        self.hook = gt.GcollHookState("qsgd:bits=4", comm=self.comm, model=model,
                                      policy=policy)
        canon = lambda s: gcoll.Compressor(s).spec  # noqa: E731
        want = {"module.0.weight": canon("topk:density=0.5"),
                "module.2.weight": canon("topk:density=0.05"),
                "module.4.weight": canon("sign")}
        want.update({"module.%d.bias" % i: "none" for i in (0, 2, 4)})
        self.assertEqual(self.hook.specs, want)
        log = self.capture(model, self.hook)
        self.train(model, 5)
        layouts = self.replay(log, model, want)
        # DDP rebuilt its buckets after the first step, and the later buckets hold
        # several parameters of different specs
        self.assertNotEqual(layouts[1], layouts[2])
        self.assertEqual(layouts[2], layouts[5])
        self.assertTrue(any(len(b) > 2 for b in layouts[2]), layouts[2])
        self.assert_same_weights(model)
        self.hook.close()

    def test_type_selectors_seed_and_embeddings(self):
        """policy="seed": norms and biases dense, the embedding table row-sparse (its row
        width filled in), the convolution at 1% and the linear last layer at 10%; every
        reduced bucket equals the per-parameter replay. type:PATTERN rules match the
        owning module's class; the embedding goes row-sparse by default."""
        canon = lambda s: gcoll.Compressor(s).spec  # noqa: E731
        model = make_mixed()
        self.hook = gt.GcollHookState("topk:density=0.05", comm=self.comm, model=model,
                                      policy="seed")
        want = {"module.emb.weight": canon("rowsparse:dim=8"),
                "module.conv.weight": canon("topk:density=0.01"),
                "module.fc.weight": canon("topk:density=0.1"),
                "module.conv.bias": "none", "module.bn.weight": "none",
                "module.bn.bias": "none", "module.fc.bias": "none"}
        self.assertEqual(self.hook.specs, want)
        log = self.capture(model, self.hook)
        self.train(model, 4)
        self.replay(log, model, want)
        self.assert_same_weights(model)
        self.hook.close()
        model = make_mixed()
        self.hook = gt.GcollHookState("fp16", comm=self.comm, model=model,
                                      policy="type:Conv*=sign;type:*Norm*=none")
        specs = self.hook.specs
        self.assertEqual(specs["module.conv.weight"], canon("sign"))
        self.assertEqual(specs["module.conv.bias"], canon("sign"))
        self.assertEqual(specs["module.bn.weight"], "none")
        self.assertEqual(specs["module.fc.weight"], canon("fp16"))
        self.assertEqual(specs["module.emb.weight"], canon("rowsparse:dim=8"))
        self.hook.close()
        with self.assertRaisesRegex(ValueError, "class name pattern"):
            gt.GcollHookState("fp16", comm=self.comm, model=make_mixed(), policy="type:=sign")

    def test_none_is_dense_everywhere(self):
        """The default spec "none" (canonically "none:ef=1") reduces every parameter
        dense, the embedding table included (no row-sparse default, no state), and each
        bucket equals the dense allreduce of its inputs."""
        model = make_mixed()
        self.hook = gt.GcollHookState("none", comm=self.comm, model=model)
        want = {n: "none" for n, _p in model.named_parameters()}
        self.assertEqual(self.hook.specs, want)
        self.assertEqual(self.hook.states, {})
        log = self.capture(model, self.hook)
        self.train(model, 3)
        self.replay(log, model, want)
        self.assert_same_weights(model)
        self.hook.close()

    def test_default_spec_from_environment(self):
        model = make_model()
        os.environ["GCOLL_COMPRESSOR"] = "sign"
        os.environ["GCOLL_LAYER_POLICY"] = "*.4.*=none"
        try:
            self.hook = gt.GcollHookState(comm=self.comm, model=model)
        finally:
            del os.environ["GCOLL_COMPRESSOR"], os.environ["GCOLL_LAYER_POLICY"]
        sign = gcoll.Compressor("sign").spec
        self.assertEqual(self.hook.spec, sign)
        want = {n: ("none" if n.startswith("module.4.") else sign)
                for n, _ in model.named_parameters()}
        self.assertEqual(self.hook.specs, want)
        log = self.capture(model, self.hook)
        self.train(model, 3)
        self.replay(log, model, want)
        self.hook.close()
        # without anything set: topk:density=0.01
        model = make_model()
        st = gt.GcollHookState(comm=self.comm, model=model)
        self.assertEqual(set(st.specs.values()), {gcoll.Compressor("topk:density=0.01").spec})
        st.close()

    def test_warmup_and_accumulation(self):
        """warmup= reaches sparsifiers without warmup_steps (not the others, nor a spec
        that sets its own); accumulate_steps=3 reduces the sum of three steps' gradients
        on the third and returns zeros on the other two."""
        model = make_model()
        policy = "module.0.weight=topk:density=0.1,warmup_steps=1;*bias*=none;*.4.*=fp16"
        self.hook = gt.GcollHookState("topk:density=0.05", comm=self.comm, model=model,
                                      policy=policy, warmup=4, accumulate_steps=3)
        canon = lambda s: gcoll.Compressor(s).spec  # noqa: E731
        want = {"module.0.weight": canon("topk:density=0.1,warmup_steps=1"),
                "module.2.weight": canon("topk:density=0.05,warmup_steps=4"),
                "module.4.weight": canon("fp16"),
                "module.0.bias": "none", "module.2.bias": "none", "module.4.bias": "none"}
        self.assertEqual(self.hook.specs, want)
        self.assertIn("warmup_steps=4", self.hook.spec)
        log = self.capture(model, self.hook)
        reduced = []
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(9):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            reduced.append(self.hook.reduced)
            if self.hook.reduced:
                opt.step()
        self.assertEqual(reduced, [False, False, True] * 3)
        self.replay(log, model, want, accumulate=3)
        self.assertEqual(self.hook.states["module.2.weight"].step, 3)
        self.assert_same_weights(model)
        # the state_dict carries the accumulation half way through a cycle
        x, y = next(batches(1, seed=5))
        nn.functional.cross_entropy(model(x), y).backward()
        sd = self.hook.state_dict()
        self.assertTrue(any(e["acc"] and any(e["acc"]) for e in sd["params"]))
        self.hook.close()
        os.environ["GCOLL_ACCUMULATE_STEPS"] = "0"
        try:
            with self.assertRaisesRegex(ValueError, "GCOLL_ACCUMULATE_STEPS"):
                gt.GcollHookState(comm=self.comm, model=make_model())
            os.environ["GCOLL_ACCUMULATE_STEPS"] = "2"
            st = gt.GcollHookState(comm=self.comm, model=make_model())
            self.assertEqual(st.accumulate_steps, 2)
            st.close()
        finally:
            del os.environ["GCOLL_ACCUMULATE_STEPS"]

    def test_half_buckets_compressed(self):
        """float16 and bfloat16 buckets are compressed (from a float32 copy), not sent
        dense: fewer bytes than the dense half-precision ring, and the replayed result."""
        for dtype in (torch.float16, torch.bfloat16):
            with self.subTest(dtype=dtype):
                if dtype == torch.bfloat16 and dist.get_backend() == "gloo":
                    self.skipTest("Gloo cannot broadcast bfloat16 (DDP's first sync); the "
                                  "gcoll backend is not built")
                model = make_model(dtype=dtype)
                self.hook = gt.GcollHookState("topk:density=0.02", comm=self.comm,
                                              model=model)
                log = self.capture(model, self.hook)
                nparam = sum(p.numel() for p in model.parameters())
                before = self.comm.counters().bytes_sent
                steps = 4
                self.train(model, steps)
                sent = (self.comm.counters().bytes_sent - before) / steps
                self.assertTrue(all(inp.dtype == dtype for _, _, inp, _ in log))
                dense = 2 * (SIZE - 1) / SIZE * nparam * 2  # a ring of halves
                self.assertLess(sent, dense / 4, "%.0f bytes per step sent, dense %s: %.0f"
                                % (sent, dtype, dense))
                want = {n: gcoll.Compressor("topk:density=0.02").spec
                        for n, _ in model.named_parameters()}
                self.replay(log, model, want)
                self.assert_same_weights(model)
                self.hook.close()

    def test_errors(self):
        model = make_model()
        with self.assertRaisesRegex(ValueError, "layer policy"):
            gt.GcollHookState(comm=self.comm, model=model, policy="*bias*")
        with self.assertRaisesRegex(ValueError, "need model="):
            gt.GcollHookState("sign", comm=self.comm, accumulate_steps=2)
        with self.assertRaisesRegex(ValueError, "accumulate_steps"):
            gt.GcollHookState("sign", comm=self.comm, model=model, accumulate_steps=0)
        with self.assertRaisesRegex(ValueError, "GCOLL_ADAPT='nonsense'"):
            gt.GcollHookState("sign", comm=self.comm, model=model, adapt="nonsense")
        os.environ["GCOLL_ADAPT"] = "bandwidth"
        try:
            with self.assertRaisesRegex(ValueError, "GCOLL_ADAPT=bandwidth.*needs model="):
                gt.GcollHookState("sign", comm=self.comm)
        finally:
            del os.environ["GCOLL_ADAPT"]

    def test_adaptation(self):
        """GCOLL_ADAPT reaches the hook: a controller per compressed parameter whose codec
        has a density; its decisions are the same on every rank and the results are bit for
        bit those of compressed_allreduce with a controller of the same rules."""
        model = make_model()
        rules = "snr+stage"
        os.environ["GCOLL_ADAPT"] = rules
        try:
            self.hook = gt.GcollHookState("topk:density=0.05", comm=self.comm, model=model,
                                          policy="*bias*=none;last=fp16")
        finally:
            del os.environ["GCOLL_ADAPT"]
        specs = self.hook.specs
        log = self.capture(model, self.hook)
        steps = 8
        self.train(model, steps)
        stats = self.hook.adapt_stats()
        # fp16 (the last layer) and the dense biases have nothing to adapt
        self.assertEqual(sorted(stats), ["module.0.weight", "module.2.weight"])
        dens = []
        for n in sorted(stats):
            self.assertEqual(stats[n]["steps"], steps, n)
            self.assertTrue(0 < stats[n]["density"] <= 1, stats[n])
            dens.append(stats[n]["density"])
        self.assert_same_densities(dens)
        self.replay(log, model, specs, adapt=rules, adapted=stats)
        self.assert_same_weights(model)
        with self.assertRaisesRegex(ValueError, "not saved"):
            self.hook.state_dict()
        self.hook.close()

    def test_adaptation_budget(self):
        """GCOLL_ADAPT=budget in the hook: the parameters' controllers share one budget
        (gcoll_adapt_join), so their densities move apart from the spec's while their k
        add up to the spec's total; the same on every rank, and bit for bit the replay's
        controllers joined alike."""
        model = make_model()
        self.hook = gt.GcollHookState("topk:density=0.05", comm=self.comm, model=model,
                                      policy="*bias*=none;last=fp16", adapt="budget")
        specs = self.hook.specs
        log = self.capture(model, self.hook)
        steps = 8
        self.train(model, steps)
        stats = self.hook.adapt_stats()
        self.assertEqual(sorted(stats), ["module.0.weight", "module.2.weight"])
        sizes = {n: p.numel() for n, p in model.module.named_parameters()}
        k = {n: round(stats[n]["density"] * sizes["%s.weight" % n.split(".")[1]])
             for n in stats}
        total = sum(-(-sizes["%s.weight" % n.split(".")[1]] * 5 // 100) for n in stats)
        # each member takes its share when its own call ends, from the group's latest
        # energies: the sum is the budget's within a pair or two
        self.assertLessEqual(abs(sum(k.values()) - total), 2, (k, total))
        self.assertNotEqual(stats["module.0.weight"]["density"],
                            stats["module.2.weight"]["density"])
        self.assert_same_densities([stats[n]["density"] for n in sorted(stats)])
        self.replay(log, model, specs, adapt="budget", adapted=stats)
        self.assert_same_weights(model)
        self.hook.close()


if __name__ == "__main__":
    unittest.main()
