# test_fsdp.py: FSDP2 (fully_shard) on gcoll's backend, and gcoll.torch.fsdp_compress.
"""Run: gcoll-run -n 2 -x MASTER_PORT=P python test_fsdp.py, with torch >= 2.6 (FSDP2).
The process group is "gcoll" when the backend extension loads into this torch, else
Gloo (GCOLL_TEST_BACKEND overrides); fsdp_compress's collectives run on a gcoll.Comm
either way. Every rank runs the same steps in the same order."""

import io
import os
import unittest

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll
import gcoll.torch as gt

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])
BACKEND = os.environ.get("GCOLL_TEST_BACKEND") or ("gcoll" if gt.backend_available() else "gloo")
LR = 0.05
COMM = None
MESH = None


def setUpModule():
    global COMM, MESH
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group(BACKEND, rank=RANK, world_size=SIZE)
    MESH = init_device_mesh("cpu", (SIZE,))
    if RANK == 0:
        print("test_fsdp: process group backend %s" % BACKEND, flush=True)
    COMM = gcoll.Comm(size=SIZE, rank=RANK, root=gt.default_root())


def tearDownModule():
    COMM.close()
    dist.destroy_process_group()


def mlp(seed):
    torch.manual_seed(seed)
    # 37 rows: not a multiple of the world size, so FSDP2 pads the last shard
    return nn.Sequential(nn.Linear(20, 37), nn.ReLU(), nn.Linear(37, 64), nn.ReLU(),
                         nn.Linear(64, 5))


def shard(net):
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=MESH)
    fully_shard(net, mesh=MESH)
    return net


TEACHER = torch.randn(20, 5, generator=torch.Generator().manual_seed(7))


def batches(steps, seed=100):
    g = torch.Generator().manual_seed(seed + RANK)  # each rank its own samples
    return [torch.randn(16, 20, generator=g) for _ in range(steps)]


def train(model, opt, xs):
    grads = []
    for x in xs:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), (x @ TEACHER).argmax(1))
        loss.backward()
        grads.append(max(float(p.grad.abs().max()) for p in model.parameters()))
        opt.step()
    return grads


def full(model):
    return [p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in model.parameters()]


def local(model):
    return [p.to_local().detach().clone() for p in model.parameters()]


class TestFSDP2(unittest.TestCase):
    def test_fsdp2_trains_as_ddp(self):
        steps = 12
        ddp = DDP(mlp(1))
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        gmax = max(train(ddp, opt, batches(steps)))
        ref = [p.detach().clone() for p in ddp.parameters()]
        fs = shard(mlp(1))
        opt = torch.optim.SGD(fs.parameters(), lr=LR)
        train(fs, opt, batches(steps))
        got = full(fs)
        # Forward and backward see the same full parameters; the averaged gradient may
        # differ by the rounding of the average (DDP all-reduces, FSDP2 reduce-scatters,
        # each may sum and divide in its own order): at most 2 roundings, 2^-23 relative,
        # of each gradient element per step, so the direct effect on a parameter after
        # 12 steps is <= 12 * LR * gmax * 2^-23. Each difference also feeds the later
        # steps' gradients; at LR * curvature < 1 that at most doubles it per step, hence
        # the factor 2^12 (a bound that still catches a missing average: LR * gmax).
        tol = steps * LR * gmax * 2.0**-23 * 2**steps
        self.assertLess(tol, LR * gmax / 10)
        if RANK == 0:
            print("test_fsdp: FSDP2 against DDP after %d steps on %s: max |difference| %g, "
                  "bound %g" % (steps, BACKEND, max(float((a - b).abs().max())
                                                    for a, b in zip(got, ref)), tol), flush=True)
        for a, b in zip(got, ref):
            self.assertEqual(a.shape, b.shape)
            torch.testing.assert_close(a, b, rtol=0, atol=tol)
        # and the weights moved (12 steps of SGD, not a no-op)
        init = [p.detach() for p in mlp(1).parameters()]
        self.assertGreater(max(float((a - b).abs().max()) for a, b in zip(got, init)), 1e-3)


class TestFsdpCompress(unittest.TestCase):
    def test_reduce_scatter_equals_replay(self):
        spec = "topk:density=0.1"
        fs = shard(mlp(2))
        st = gt.fsdp_compress(fs, spec, comm=COMM)
        # the root holds no parameters of its own: the three layers reduce-scatter
        self.assertEqual(sorted(st.modules), ["0", "2", "4"])
        st.trace = []
        opt = torch.optim.SGD(fs.parameters(), lr=LR, momentum=0.9)
        train(fs, opt, batches(4))
        self.assertEqual(len(st.trace), 4 * len(st.modules))
        comp = gcoll.Compressor(spec)
        states = {}
        for name, inp, out in st.trace:
            self.assertEqual(inp.numel(), st.modules[name].count)
            ts = states.get(name) or states.setdefault(name, gcoll.TensorState(comp, inp.numel()))
            off, n = COMM.shard_range(inp.numel())
            self.assertEqual(out.numel(), n)
            self.assertEqual(off, RANK * n)  # FSDP2's block r is gcoll's shard r
            want = COMM.compressed_reduce_scatter(ts, inp, torch.empty(n), op="avg")
            self.assertTrue(torch.equal(want, out), "module %r" % name)
        # top-k 10%: far from the dense average, so the hook cannot be a no-op
        name, inp, out = st.trace[-1]
        dense = torch.empty_like(out)
        dist.reduce_scatter_single(dense, inp, op=dist.ReduceOp.AVG)
        self.assertFalse(torch.equal(dense, out))
        st.close()

    def _run(self, seed, steps, xs, sd=None):
        fs = shard(mlp(seed))
        st = gt.fsdp_compress(fs, "topk:density=0.05", allgather="bf16", comm=COMM, warmup=2)
        opt = torch.optim.SGD(fs.parameters(), lr=LR, momentum=0.9)
        if sd is not None:
            buf = io.BytesIO(sd)
            saved = torch.load(buf, weights_only=False)
            fs.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            st.load_state_dict(saved["gcoll"])
        train(fs, opt, xs[:steps])
        return fs, opt, st

    def test_checkpoint_continues_bit_for_bit(self):
        xs = batches(8, seed=300)
        a, _oa, sa = self._run(3, 8, xs)
        want = local(a)
        sa.close()
        b, ob, sb = self._run(3, 4, xs)
        buf = io.BytesIO()
        torch.save({"model": b.state_dict(), "opt": ob.state_dict(), "gcoll": sb.state_dict()},
                   buf)
        sd_gcoll = sb.state_dict()
        sb.close()
        # a fresh model with other initial weights, restored, then the last 4 batches
        c, _oc, sc = self._run(4, 4, xs[4:], sd=buf.getvalue())
        for p, q in zip(local(c), want):
            self.assertTrue(torch.equal(p, q))
        # qwZ: the all-gather carried bf16 (2 bytes a parameter) of the other ranks' shards
        self.assertGreater(sc.bytes_allgather, 0)
        # another world size, another rank: clear errors, state unchanged
        bad = dict(sd_gcoll, world_size=SIZE + 1)
        with self.assertRaisesRegex(ValueError, "job of %d ranks, this one has %d"
                                    % (SIZE + 1, SIZE)):
            sc.load_state_dict(bad)
        with self.assertRaisesRegex(ValueError, "rank"):
            sc.load_state_dict(dict(sd_gcoll, rank=(RANK + 1) % SIZE))
        sc.close()

    def _forward_weight(self, allgather):
        """The weight layer 2 computes with in forward, and the fp32 weight."""
        fs = shard(mlp(8))
        st = gt.fsdp_compress(fs, "topk:density=0.1", allgather=allgather, comm=COMM)
        seen = []
        h = fs[2].register_forward_pre_hook(lambda m, _a: seen.append(m.weight.detach().clone()))
        fs(batches(1, seed=800)[0])
        h.remove()
        st.close()
        return seen[0], fs[2].weight.detach().full_tensor()

    def test_allgather_quantized_afresh(self):
        used, w = self._forward_weight("bf16")
        # bf16 is elementwise round-to-nearest-even: the forward sees exactly that of w
        self.assertTrue(torch.equal(used, w.to(torch.bfloat16).float()))
        self.assertFalse(torch.equal(used, w))
        try:
            gcoll.check_spec("mxfp8:format=e4m3")
        except ValueError:
            self.skipTest("this gcoll has no mxfp8")
        used, w = self._forward_weight("mxfp8:format=e4m3")
        # E4M3 keeps 3 mantissa bits (half an ulp: 2^-4 relative); MX v1.0's shared scale
        # puts a block's largest in [256, 512), above E4M3's 448, where it saturates:
        # at most 64/512 = 2^-3 of the block's largest, so <= 2^-3 of max |w| overall
        err = float((used - w).abs().max())
        self.assertGreater(err, 0)
        self.assertLessEqual(err, 2.0**-3 * float(w.abs().max()))

    def _reuse_run(self, reuse):
        fs = shard(mlp(9))
        st = gt.fsdp_compress(fs, "topk:density=0.1", allgather="bf16", comm=COMM,
                              allgather_reuse=reuse)
        opt = torch.optim.SGD(fs.parameters(), lr=LR, momentum=0.9)
        train(fs, opt, batches(3, seed=900))
        x = batches(1, seed=950)[0]
        with torch.no_grad():
            outs = [fs(x), fs(x)]  # the second: every rank's parameters unchanged
            # rank 0 alone changes its shard of layer 2: its message differs, the other
            # ranks' do not, so no rank may reuse (else the ranks' collectives mismatch)
            if RANK == 0:
                fs[2].weight.to_local().add_(0.25)
            outs.append(fs(x))
        return st, outs, local(fs)

    def test_allgather_reuse(self):
        sa, outs_a, wa = self._reuse_run(True)
        sb, outs_b, wb = self._reuse_run(False)
        # the same operations on the same bytes: bit-equal either way
        for p, q in zip(wa + outs_a, wb + outs_b):
            self.assertTrue(torch.equal(p, q))
        self.assertFalse(torch.equal(outs_a[1], outs_a[2]))  # rank 0's change was seen
        self.assertEqual(sb.allgather_reused, 0)
        # the second forward reuses all 3 modules' gathers, the third those of layers 0
        # and 4 but not 2; backward's second gathers of the training steps add to that
        self.assertGreaterEqual(sa.allgather_reused, 3 + 2)
        self.assertLess(sa.bytes_allgather, sb.bytes_allgather)
        if RANK == 0:
            print("test_fsdp: all-gather reuse: %d gathers reused, %d bytes against %d"
                  % (sa.allgather_reused, sa.bytes_allgather, sb.bytes_allgather), flush=True)
        sa.close()
        sb.close()
        with self.assertRaisesRegex(ValueError, "allgather_reuse"):
            gt.fsdp_compress(shard(mlp(9)), allgather="bf16", comm=COMM, allgather_reuse=1)

    def test_layer_policy_by_module_name(self):
        fs = shard(mlp(5))
        st = gt.fsdp_compress(fs, "topk:density=0.1", policy="4=none;2=topk:density=0.3",
                              comm=COMM, warmup=3)
        self.assertEqual(st.modules["4"].spec, "none")
        self.assertIsNone(st.modules["4"].ts)
        self.assertIn("density=0.3", st.modules["2"].spec)
        self.assertIn("density=0.1", st.modules["0"].spec)
        self.assertIn("warmup_steps=3", st.modules["0"].spec)
        st.close()

    def test_layer_policy_by_module_type(self):
        """type: rules match the FSDP module's own class (fully_shard makes it a subclass
        FSDPLinear); "seed" gives each Linear 10% (first, last, and by type)."""
        fs = shard(mlp(5))
        st = gt.fsdp_compress(fs, "fp16", policy="type:Sequential=none;type:Lin*=sign",
                              comm=COMM)
        self.assertEqual(st.modules["root"].spec if "root" in st.modules else "none", "none")
        for m in ("0", "2", "4"):
            self.assertIn("sign", st.modules[m].spec)
        st.close()
        fs = shard(mlp(5))
        st = gt.fsdp_compress(fs, "fp16", policy="seed", comm=COMM)
        for m in ("0", "2", "4"):
            self.assertIn("density=0.1", st.modules[m].spec)
        st.close()

    def test_embedding_rows_by_default(self):
        """An FSDP unit made of an EmbeddingBag goes row-sparse with dim= its
        embedding_dim unless a rule names it, and loses nothing: its reduce-scatter equals
        a replay bit for bit and the dense average within one rounding of the sum."""
        torch.manual_seed(11)
        # 45 rows: FSDP2 pads to 46 (23 a rank), whole rows of 6 values
        net = nn.Sequential(nn.EmbeddingBag(45, 6, mode="sum"), nn.Linear(6, 5))
        fully_shard(net[0], mesh=MESH)
        fully_shard(net[1], mesh=MESH)
        fully_shard(net, mesh=MESH)
        st = gt.fsdp_compress(net, "topk:density=0.1", comm=COMM)
        self.assertEqual(st.modules["0"].spec.split("+")[0].split(",ef=")[0],
                         "rowsparse:dim=6")
        self.assertIn("topk", st.modules["1"].spec)
        self.assertEqual(st.modules["0"].count % 6, 0)
        st.trace = []
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        g = torch.Generator().manual_seed(300 + RANK)
        for _ in range(3):  # each rank touches its own few rows
            idx = torch.randint(0, 45, (8, 3), generator=g)
            opt.zero_grad()
            net(idx).square().sum().backward()
            opt.step()
        comp, states, seen = gcoll.Compressor(st.modules["0"].spec), None, 0
        for name, inp, out in st.trace:
            if name != "0":
                continue
            seen += 1
            states = states or gcoll.TensorState(comp, inp.numel())
            n = out.numel()
            want = COMM.compressed_reduce_scatter(states, inp, torch.empty(n), op="avg")
            self.assertTrue(torch.equal(want, out))
            dense = torch.empty_like(out)
            dist.reduce_scatter_single(dense, inp, op=dist.ReduceOp.AVG)
            # lossless rows: the same sum of SIZE values, maybe in another order, so within
            # SIZE roundings of the largest magnitude (2^-24 each)
            tol = SIZE * 2.0 ** -24 * float(inp.abs().max()) + 1e-30
            self.assertLessEqual(float((dense - out).abs().max()), tol)
            self.assertGreater(int((inp == 0).sum()), 0)  # rows untouched: sparse input
        self.assertEqual(seen, 3)
        st.close()
        # a rule that names the unit wins over the default; "none" turns it off
        st = gt.fsdp_compress(net, "topk:density=0.1", policy="0=fp16", comm=COMM)
        self.assertTrue(st.modules["0"].spec.startswith("fp16"))
        st.close()
        st = gt.fsdp_compress(net, "none", comm=COMM)
        self.assertEqual(st.modules["0"].spec, "none")
        st.close()

    def test_adapt_trains_and_refuses_checkpoints(self):
        fs = shard(mlp(7))
        st = gt.fsdp_compress(fs, "topk:density=0.05", comm=COMM, adapt="snr")
        self.assertTrue(all(m.ctl is not None for m in st.modules.values()))
        opt = torch.optim.SGD(fs.parameters(), lr=LR)
        train(fs, opt, batches(3, seed=700))
        self.assertTrue(all(m.ts.step == 3 for m in st.modules.values()))
        with self.assertRaisesRegex(ValueError, "GCOLL_ADAPT=snr"):
            st.state_dict()
        st.close()

    def test_errors(self):
        fs = shard(mlp(5))
        with self.assertRaisesRegex(ValueError, "densty|density|unknown"):
            gt.fsdp_compress(fs, "topk:densty=0.1", comm=COMM)
        with self.assertRaises(ValueError):
            gt.fsdp_compress(fs, "topkk", comm=COMM)
        with self.assertRaises(ValueError):
            gt.fsdp_compress(fs, allgather="bf17", comm=COMM)
        with self.assertRaisesRegex(ValueError, "stateless"):
            gt.fsdp_compress(fs, allgather="topk:density=0.1", comm=COMM)
        with self.assertRaisesRegex(ValueError, "no module under Sequential has FSDP2 state"):
            gt.fsdp_compress(mlp(5), comm=COMM)
        with self.assertRaisesRegex(ValueError, "GCOLL_ADAPT"):
            gt.fsdp_compress(fs, comm=COMM, adapt="sner")
        ddp = DDP(mlp(5))
        with self.assertRaisesRegex(TypeError, "ZeroRedundancyOptimizer"):
            gt.register_zero2(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), comm=COMM)
        with self.assertRaisesRegex(ValueError, "densty|density|unknown"):
            from torch.distributed.optim import ZeroRedundancyOptimizer
            gt.register_zero2(ddp, ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD,
                                                           lr=LR), "topk:densty=0.1", comm=COMM)


class TestZero2(unittest.TestCase):
    def test_zero2_equals_replay(self):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        spec, steps = "topk:density=0.2", 6
        net = mlp(6)
        init = {n: p.detach().clone() for n, p in net.named_parameters()}
        model = DDP(net, bucket_cap_mb=0.004)  # a few buckets
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=LR)
        owners = {opt._param_to_rank[p] for p in model.parameters()}
        self.assertEqual(owners, set(range(SIZE)))  # every rank owns a part
        st = gt.register_zero2(model, opt, spec, comm=COMM)
        st.trace = []
        train(model, opt, batches(steps, seed=500))
        # the reference: the same SGD on a full copy, its gradient rebuilt from a replay of
        # each bucket's compressed reduce-scatter with fresh states, every rank's shard
        # gathered
        ref = mlp(6)
        for n, p in ref.named_parameters():
            p.data.copy_(init[n])
        params = dict(("module." + n, p) for n, p in ref.named_parameters())
        ropt = torch.optim.SGD(ref.parameters(), lr=LR)
        comp, states, step = gcoll.Compressor(spec), {}, 0
        self.assertEqual(st.trace[-1][0], steps)
        for s, layout, block, x, y in st.trace + [(None, None, None, None, None)]:
            if s != step and step:
                ropt.step()
            if s is None:
                break
            if s != step:
                ropt.zero_grad()
                for p in ref.parameters():
                    p.grad = torch.zeros_like(p)
                step = s
            key = tuple(e[0] for e in layout)
            ts = states.get(key) or states.setdefault(key, gcoll.TensorState(comp, x.numel()))
            mine = COMM.compressed_reduce_scatter(ts, x, torch.empty(block), op="avg")
            self.assertTrue(torch.equal(mine, y))
            blocks = COMM.allgather(mine, torch.empty(block * SIZE)).view(SIZE, block)
            for name, r, _off, boff, n in layout:
                params[name].grad.view(-1).copy_(blocks[r, boff:boff + n])
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), params[n].detach()), n)
        self.assertFalse(torch.equal(params["module.0.weight"], init["0.weight"]))
        st.close()


if __name__ == "__main__":
    unittest.main()
