# test_backend.py: the torch.distributed backend "gcoll" against results computed here.
"""Run: gcoll-run -n 2 (or 3) -x MASTER_PORT=P python3 test_backend.py. Rank and size
come from GCOLL_RANK/GCOLL_SIZE (set by gcoll-run); torch's rendezvous is env:// at
127.0.0.1:MASTER_PORT. GCOLL_JOB_KEY is removed first, so that the job key travels through
torch's Store (test_ddp_backend.py covers the key from the environment).

Every rank's input is a known function of (rank, seed), so each rank computes what every
collective must return from all ranks' inputs, independently of any communication."""

import os
import unittest

import torch
import torch.distributed as dist

import gcoll
import gcoll.torch as gt

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}
# AVG of floats divides, so the result is rounded; everything else is exact with these
# small integer inputs (sums <= 3 * 8, products <= 27 fit every dtype's mantissa).
RTOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def setUpModule():
    os.environ.pop("GCOLL_JOB_KEY", None)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(RANK), str(SIZE)
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", init_method="env://")


def tearDownModule():
    dist.destroy_process_group()


def data(rank, n, dtype, seed, lo=-8, hi=8):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64).to(dtype)


def expected_reduce(name, inputs, dtype):
    x = torch.stack([i.to(torch.float64) for i in inputs])
    if name == "sum":
        r = x.sum(0)
    elif name == "prod":
        r = x.prod(0)
    elif name == "min":
        r = x.min(0).values
    elif name == "max":
        r = x.max(0).values
    elif dtype.is_floating_point:
        r = x.sum(0) / SIZE
    else:
        return torch.div(x.sum(0).to(torch.int64), SIZE, rounding_mode="trunc").to(dtype)
    return r.to(dtype)


class TestBackend(unittest.TestCase):
    def check(self, got, want, exact=True):
        self.assertEqual(got.dtype, want.dtype)
        if exact or not want.dtype.is_floating_point:
            self.assertTrue(torch.equal(got, want), "got %s, want %s" % (got[:8], want[:8]))
        else:
            torch.testing.assert_close(got, want, rtol=RTOL[want.dtype], atol=0)

    def test_identity(self):
        pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        self.assertIsInstance(pg, gt._torch_backend.BackendGcoll)
        self.assertEqual(dist.get_backend().lower(), "gcoll")
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (RANK, SIZE))
        self.assertIn(pg.transport, gcoll.transports_built())
        self.assertTrue(gt.backend_available())

    def test_all_reduce_every_op_and_dtype(self):
        seed = 1
        for dtype in DTYPES:
            for name, op in OPS.items():
                seed += 1
                lo, hi = (-3, 3) if name == "prod" else (-8, 8)
                for n in (1, 1001):
                    with self.subTest(dtype=dtype, op=name, n=n):
                        inputs = [data(q, n, dtype, seed, lo, hi) for q in range(SIZE)]
                        t = inputs[RANK].clone()
                        dist.all_reduce(t, op=op)  # in place
                        self.check(t, expected_reduce(name, inputs, dtype), exact=name != "avg")

    def test_all_reduce_async_strided_large_empty(self):
        inputs = [data(q, 1 << 17, torch.float32, 99) for q in range(SIZE)]
        want = expected_reduce("sum", inputs, torch.float32)
        ts = [inputs[RANK].clone() for _ in range(4)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in reversed(works):  # any wait order
            self.assertTrue(w.wait())
        for w, t in zip(works, ts):
            self.assertTrue(w.is_completed())
            self.check(t, want)
            self.check(w.result()[0], want)
        # the future carries the tensors and runs callbacks
        t = inputs[RANK].clone()
        fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        self.check(fut.wait(), want * 2)
        # a strided (transposed) tensor is reduced in place as well
        m = [data(q, 12, torch.float64, 5).view(3, 4) for q in range(SIZE)]
        t = m[RANK].clone().t()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        self.check(t, torch.stack(m).max(0).values.t())
        e = torch.empty(0)
        dist.all_reduce(e)
        self.assertEqual(e.numel(), 0)

    def test_broadcast(self):
        for dtype in DTYPES:
            for root in range(SIZE):
                with self.subTest(dtype=dtype, root=root):
                    t = data(RANK, 333, dtype, 10 + root)
                    w = dist.broadcast(t, src=root, async_op=True)
                    w.wait()
                    self.check(t, data(root, 333, dtype, 10 + root))

    def test_all_gather(self):
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                outs = [torch.empty(2, 5, dtype=dtype) for _ in range(SIZE)]
                dist.all_gather(outs, data(RANK, 10, dtype, 3).view(2, 5))
                for q in range(SIZE):
                    self.check(outs[q], data(q, 10, dtype, 3).view(2, 5))
                flat = torch.empty(SIZE * 7, dtype=dtype)
                dist.all_gather_into_tensor(flat, data(RANK, 7, dtype, 4))
                self.check(flat, torch.cat([data(q, 7, dtype, 4) for q in range(SIZE)]))

    def test_reduce_scatter(self):
        for dtype in DTYPES:
            for name in ("sum", "max"):
                with self.subTest(dtype=dtype, op=name):
                    blocks = {q: [data(q, 6, dtype, 20 + j) for j in range(SIZE)]
                              for q in range(SIZE)}
                    out = torch.empty(6, dtype=dtype)
                    dist.reduce_scatter(out, blocks[RANK], op=OPS[name])
                    want = expected_reduce(name, [blocks[q][RANK] for q in range(SIZE)], dtype)
                    self.check(out, want)
                    out2 = torch.empty(6, dtype=dtype)
                    dist.reduce_scatter_tensor(out2, torch.cat(blocks[RANK]), op=OPS[name])
                    self.check(out2, want)

    def test_all_to_all(self):
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                # rank q sends j + q + 1 elements to rank j: uneven blocks
                ins = [data(RANK, j + RANK + 1, dtype, 30 + j) for j in range(SIZE)]
                outs = [torch.empty(RANK + q + 1, dtype=dtype) for q in range(SIZE)]
                dist.all_to_all(outs, ins)
                for q in range(SIZE):
                    self.check(outs[q], data(q, RANK + q + 1, dtype, 30 + RANK))
                # all_to_all_single, even split of dim 0 (rows of 3)
                inp = data(RANK, SIZE * 2 * 3, dtype, 40).view(SIZE * 2, 3)
                out = torch.empty_like(inp)
                dist.all_to_all_single(out, inp)
                want = torch.cat([data(q, SIZE * 2 * 3, dtype, 40).view(SIZE * 2, 3)
                                  [2 * RANK:2 * RANK + 2] for q in range(SIZE)])
                self.check(out, want)
                # ... and with split sizes: rank q sends j + 1 rows to rank j
                in_splits = [j + 1 for j in range(SIZE)]
                out_splits = [RANK + 1] * SIZE
                inp = data(RANK, sum(in_splits) * 2, dtype, 50).view(-1, 2)
                out = torch.empty(sum(out_splits), 2, dtype=dtype)
                dist.all_to_all_single(out, inp, out_splits, in_splits)
                off = sum(range(1, RANK + 1))
                want = torch.cat([data(q, sum(in_splits) * 2, dtype, 50).view(-1, 2)
                                  [off:off + RANK + 1] for q in range(SIZE)])
                self.check(out, want)

    def test_barrier(self):
        dist.barrier()
        dist.barrier(async_op=True).wait()

    def test_subgroup(self):
        # a second gcoll communicator: its rank 0 (global rank 1) publishes its own root
        # and key under the group's Store prefix
        members = list(range(1, SIZE))
        sub = dist.new_group(members, backend="gcoll")
        t = data(RANK, 50, torch.int64, 60)
        if RANK in members:
            self.assertEqual(dist.get_rank(sub), RANK - 1)
            dist.all_reduce(t, group=sub)
            self.check(t, expected_reduce("sum", [data(q, 50, torch.int64, 60)
                                                  for q in members], torch.int64))
        dist.barrier()

    def test_split_group_and_device_mesh(self):
        # split: every rank in a group of its own parity, members joined over the Store.
        # dist.split_group itself wants a default group bound to an accelerator (or
        # torchcomms) on torch 2.13, whatever the backend; ProcessGroup.split_group is the
        # C++ split it then calls (BackendGcoll::split).
        import datetime
        parity = [[q for q in range(SIZE) if q % 2 == p] for p in (0, 1)]
        mine = parity[RANK % 2]
        pg = dist.distributed_c10d._get_default_group()
        g = pg.split_group(mine, timeout=datetime.timedelta(seconds=20),
                           group_name="parity%d" % (RANK % 2))
        self.assertEqual((g.size(), g.rank()), (len(mine), mine.index(RANK)))
        t = data(RANK, 9, torch.float64, 61)
        g.allreduce([t]).wait()
        self.check(t, expected_reduce("sum", [data(q, 9, torch.float64, 61) for q in mine],
                                      torch.float64))
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (SIZE,), mesh_dim_names=("dp",))
        t = data(RANK, 5, torch.int32, 62)
        dist.all_reduce(t, group=mesh.get_group("dp"))
        self.check(t, expected_reduce("sum", [data(q, 5, torch.int32, 62) for q in range(SIZE)],
                                      torch.int32))

    def test_complex_and_bytes(self):
        # complex through the real view, as torch does
        z = [torch.complex(data(q, 7, torch.float64, 70), data(q, 7, torch.float64, 71))
             for q in range(SIZE)]
        t = z[RANK].clone()
        dist.all_reduce(t)
        self.assertTrue(torch.equal(t, sum(z)))
        # data movement of dtypes gcoll does not reduce, at sizes that are not whole words
        for dtype in (torch.uint8, torch.int8, torch.bool, torch.int16, torch.complex64):
            for n in (1, 3, 6, 1001):
                with self.subTest(dtype=dtype, n=n):
                    src = [data(q, n, torch.int64, 72, 0, 1 if dtype == torch.bool else 100)
                           .to(dtype) for q in range(SIZE)]
                    t = src[RANK].clone()
                    dist.broadcast(t, src=SIZE - 1)
                    self.assertTrue(torch.equal(t, src[SIZE - 1]))
                    outs = [torch.empty_like(src[0]) for _ in range(SIZE)]
                    dist.all_gather(outs, src[RANK])
                    self.assertTrue(all(torch.equal(o, w) for o, w in zip(outs, src)))
                    flat = torch.empty(SIZE * n, dtype=dtype)
                    dist.all_gather_into_tensor(flat, src[RANK])
                    self.assertTrue(torch.equal(flat, torch.cat(src)))

    def test_objects(self):
        objs = [{"rank": RANK, "s": "x" * (RANK + 3)}, None]
        dist.broadcast_object_list(objs, src=SIZE - 1)
        self.assertEqual(objs, [{"rank": SIZE - 1, "s": "x" * (SIZE + 2)}, None])
        out = [None] * SIZE
        dist.all_gather_object(out, (RANK, [1] * RANK))
        self.assertEqual(out, [(q, [1] * q) for q in range(SIZE)])

    def test_coalesced(self):
        ts = [data(RANK, n, torch.float32, 80 + n) for n in (3, 1, 17)]
        want = [expected_reduce("sum", [data(q, n, torch.float32, 80 + n) for q in range(SIZE)],
                                torch.float32) for n in (3, 1, 17)]
        dist.all_reduce_coalesced(ts)
        for t, w in zip(ts, want):
            self.check(t, w)
        ins = [data(RANK, 3, torch.uint8, 90, 0, 99), data(RANK, 5, torch.uint8, 91, 0, 99)]
        outs = [[torch.empty_like(i) for i in ins] for _ in range(SIZE)]
        dist.all_gather_coalesced(outs, ins)
        for q in range(SIZE):
            self.check(outs[q][0], data(q, 3, torch.uint8, 90, 0, 99))
            self.check(outs[q][1], data(q, 5, torch.uint8, 91, 0, 99))
        # the coalescing manager: all_gather_into_tensor and reduce_scatter_tensor batched
        outs = [torch.empty(SIZE * 4), torch.empty(SIZE * 2)]
        rs = [torch.empty(4), torch.empty(2)]
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(outs[0], data(RANK, 4, torch.float32, 92))
            dist.all_gather_into_tensor(outs[1], data(RANK, 2, torch.float32, 93))
        cm.wait()
        self.check(outs[0], torch.cat([data(q, 4, torch.float32, 92) for q in range(SIZE)]))
        self.check(outs[1], torch.cat([data(q, 2, torch.float32, 93) for q in range(SIZE)]))
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(rs[0], data(RANK, 4 * SIZE, torch.float32, 94))
            dist.reduce_scatter_tensor(rs[1], data(RANK, 2 * SIZE, torch.float32, 95))
        cm.wait()
        for r, n, sd in ((rs[0], 4, 94), (rs[1], 2, 95)):
            full = expected_reduce("sum", [data(q, n * SIZE, torch.float32, sd)
                                           for q in range(SIZE)], torch.float32)
            self.check(r, full[RANK * n:(RANK + 1) * n])

    def test_collective_inside_future_callback(self):
        # the callback runs when the first reduction completes and waits on a second one:
        # it must not run on the thread that completes the second
        a, b = torch.ones(4), torch.ones(4)
        fut = dist.all_reduce(a, async_op=True).get_future().then(
            lambda f: dist.all_reduce(b, async_op=True).get_future().wait())
        got = fut.wait()
        self.check(got[0], torch.full((4,), float(SIZE)))
        # two levels deep
        c = torch.ones(2)
        fut = dist.all_reduce(torch.ones(1), async_op=True).get_future().then(
            lambda f: dist.all_reduce(torch.ones(1), async_op=True).get_future().then(
                lambda g: dist.all_reduce(c, async_op=True).get_future().wait()).wait())
        self.check(fut.wait()[0], torch.full((2,), float(SIZE)))

    def test_work_wait_timeout(self):
        # rank 0 waits 0.3 s for a reduction the others start 1.5 s late: the wait times out,
        # the reduction goes on, and a second wait gets it
        import time
        g = dist.new_group(list(range(SIZE)), timeout=__import__("datetime").timedelta(seconds=30))
        t = torch.ones(3)
        if RANK != 0:
            time.sleep(1.5)
        w = dist.all_reduce(t, group=g, async_op=True)
        if RANK == 0:
            with self.assertRaises(RuntimeError):
                w.wait(timeout=__import__("datetime").timedelta(seconds=0.3))
        w.get_future().wait()
        self.check(t, torch.full((3,), float(SIZE)))

    def test_all_reduce_small_ints_bool_bitwise(self):
        # gcoll's 1- and 2-byte integers, bool and the bitwise ops against torch's own
        # arithmetic: sums wrap as the dtype does, bool SUM/MAX are or, PROD/MIN are and
        seed = 500
        bitwise = {"band": (dist.ReduceOp.BAND, torch.bitwise_and),
                   "bor": (dist.ReduceOp.BOR, torch.bitwise_or),
                   "bxor": (dist.ReduceOp.BXOR, torch.bitwise_xor)}
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            for n in (1, 1001):
                seed += 1
                inputs = [data(q, n, dtype, seed, 0, 120) for q in range(SIZE)]
                for name, (op, fn) in bitwise.items():
                    with self.subTest(dtype=dtype, op=name, n=n):
                        want = inputs[0].clone()
                        for x in inputs[1:]:
                            want = fn(want, x)
                        t = inputs[RANK].clone()
                        dist.all_reduce(t, op=op)
                        self.check(t, want)
                with self.subTest(dtype=dtype, op="sum", n=n):
                    want = inputs[0].clone()
                    for x in inputs[1:]:
                        want = want + x  # torch wraps as the dtype does
                    t = inputs[RANK].clone()
                    dist.all_reduce(t)
                    self.check(t, want)
        for n in (1, 1001):
            inputs = [data(q, n, torch.int64, 600 + n, 0, 1).bool() for q in range(SIZE)]
            anyv, allv = torch.stack(inputs).any(0), torch.stack(inputs).all(0)
            for op, want in ((dist.ReduceOp.SUM, anyv), (dist.ReduceOp.MAX, anyv),
                             (dist.ReduceOp.PRODUCT, allv), (dist.ReduceOp.MIN, allv),
                             (dist.ReduceOp.BOR, anyv), (dist.ReduceOp.BAND, allv)):
                with self.subTest(dtype=torch.bool, op=op, n=n):
                    t = inputs[RANK].clone()
                    dist.all_reduce(t, op=op)
                    self.check(t, want)

    def test_errors_are_clear(self):
        t = torch.ones(4)
        with self.assertRaisesRegex(RuntimeError, "band on dtype float32"):
            dist.all_reduce(t, op=dist.ReduceOp.BAND)
        with self.assertRaisesRegex(RuntimeError, "output list has"):
            dist.all_gather([torch.empty(4)], t)
        with self.assertRaisesRegex(RuntimeError, "split sizes add up"):
            dist.all_to_all_single(torch.empty(SIZE), torch.ones(SIZE), [1] * SIZE, [2] * SIZE)
        # none of these reached gcoll: the group still works
        dist.all_reduce(t)
        self.check(t, torch.full((4,), float(SIZE)))


if __name__ == "__main__":
    unittest.main()
