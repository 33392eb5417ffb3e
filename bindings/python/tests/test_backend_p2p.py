# test_backend_p2p.py: the "gcoll" backend's rooted collectives, point-to-point calls and
# coalesced batches against torch's own arithmetic.
"""Run: gcoll-run -n 2 (or 3) -x MASTER_PORT=P python3 test_backend_p2p.py.

Every rank's input is a known function of (rank, seed), so each rank computes what every
call must give from all ranks' inputs with torch's own operators (torch.add, torch.mul,
torch.minimum, torch.bitwise_and, ... in the tensor's dtype, so integer sums wrap as
torch's do), independently of any communication. Inputs are small integers: every sum,
product, minimum and maximum is exact in every dtype (fp16 and bf16 included), so results
are compared bit for bit; only AVG of a float divides, and is compared within the dtype's
rounding (one rounding of a value computed in fp32 or fp64: 2^-10 relative for fp16,
2^-7 for bf16, 2^-23 for fp32)."""

import datetime
import functools
import os
import unittest

import torch
import torch.distributed as dist

import gcoll.torch  # noqa: F401  (registers the backend)

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND,
       "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
RTOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23,
        torch.float64: 2.0 ** -52}


def setUpModule():
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=RANK, world_size=SIZE,
                            timeout=datetime.timedelta(seconds=60))


def tearDownModule():
    dist.destroy_process_group()


def data(rank, n, dtype, seed, op="sum"):
    """Rank's input: small integers (in [0, 3] for products, signed where the dtype is)."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    hi = 3 if op == "prod" else 16
    lo = 0 if dtype == torch.uint8 else -hi
    return torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64).to(dtype)


def reference(name, inputs, dtype):
    """torch's result of reducing inputs with op name; None where the pair is invalid."""
    if dtype == torch.bool:  # PyTorch's mapping: SUM/MAX/BOR or, PROD/MIN/BAND and
        st = torch.stack(inputs)
        return {"sum": st.any(0), "max": st.any(0), "bor": st.any(0), "prod": st.all(0),
                "min": st.all(0), "band": st.all(0),
                "bxor": functools.reduce(torch.logical_xor, inputs)}.get(name)
    if name == "avg":
        if dtype.is_floating_point:
            return (torch.stack(inputs).double().sum(0) / SIZE).to(dtype)
        return torch.div(torch.stack(inputs).long().sum(0), SIZE,
                         rounding_mode="trunc").to(dtype)
    if name in ("band", "bor", "bxor") and dtype.is_floating_point:
        return None
    fn = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum,
          "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[name]
    return functools.reduce(fn, inputs)


class TestRootedP2P(unittest.TestCase):
    def check(self, got, want, rtol=0.0):
        self.assertEqual(got.dtype, want.dtype)
        if rtol:
            torch.testing.assert_close(got, want, rtol=rtol, atol=0)
        else:
            self.assertTrue(torch.equal(got, want), "got %s, want %s" % (got[:8], want[:8]))

    def test_reduce_every_op_dtype_and_root(self):
        seed = 0
        for root in range(SIZE):
            for dtype in DTYPES:
                for name, op in OPS.items():
                    for n in ((1, 1001) if root == 0 else (7,)):
                        seed += 1
                        with self.subTest(root=root, dtype=dtype, op=name, n=n):
                            inputs = [data(q, n, dtype, seed, name) for q in range(SIZE)]
                            want = reference(name, inputs, dtype)
                            t = inputs[RANK].clone()
                            if want is None:  # BAND/BOR/BXOR on floats, AVG on bool
                                with self.assertRaisesRegex(RuntimeError, "GCOLL_ERR_INVALID"):
                                    dist.reduce(t, dst=root, op=op)
                                continue
                            dist.reduce(t, dst=root, op=op)
                            if RANK == root:
                                avg_float = name == "avg" and dtype.is_floating_point
                                self.check(t, want, RTOL[dtype] if avg_float else 0.0)
                            else:  # the other ranks' tensors are left as they were
                                self.check(t, inputs[RANK])
        # complex through its real view; a strided tensor; async
        z = [torch.complex(data(q, 5, torch.float64, 900), data(q, 5, torch.float64, 901))
             for q in range(SIZE)]
        t = z[RANK].clone()
        dist.reduce(t, dst=SIZE - 1)
        self.check(t, sum(z) if RANK == SIZE - 1 else z[RANK])
        m = [data(q, 12, torch.int32, 902).view(3, 4) for q in range(SIZE)]
        t = m[RANK].clone().t()
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, async_op=True).wait()
        self.check(t, (torch.stack(m).max(0).values if RANK == 0 else m[RANK]).t())

    def test_gather_scatter_every_dtype_and_root(self):
        seed = 1000
        for dtype in DTYPES + [torch.complex64]:
            for root in range(SIZE):
                for n in (0, 1, 3, 1001):
                    seed += 1
                    with self.subTest(dtype=dtype, root=root, n=n):
                        src = [data(q, 2 * n, torch.int64, seed).to(dtype) for q in range(SIZE)]
                        outs = [torch.empty(2 * n, dtype=dtype) for _ in range(SIZE)]
                        dist.gather(src[RANK], outs if RANK == root else None, dst=root)
                        if RANK == root:
                            for q in range(SIZE):
                                self.check(outs[q], src[q])
                        # scatter: root's block q (rows of 2) lands on rank q, strided output
                        blocks = [data(root, 2 * n, torch.int64, seed + q * 31).to(dtype)
                                  .view(n, 2) for q in range(SIZE)]
                        out = torch.empty(2, n, dtype=dtype).t()  # not contiguous
                        dist.scatter(out, blocks if RANK == root else None, src=root)
                        self.check(out, blocks[RANK])

    def test_send_recv_every_dtype(self):
        # torch's own pattern: each rank in turn sends to all others, tag = sender
        for dtype in DTYPES + [torch.complex128]:
            for src in range(SIZE):
                with self.subTest(dtype=dtype, src=src):
                    if src == RANK:
                        for dst in range(SIZE):
                            if dst != RANK:
                                dist.send(data(RANK, 1000 + dst, torch.int64, 2000).to(dtype),
                                          dst, tag=RANK)
                    else:
                        t = torch.empty(1000 + RANK, dtype=dtype)
                        self.assertEqual(dist.recv(t, src, tag=src), src)
                        self.check(t, data(src, 1000 + RANK, torch.int64, 2000).to(dtype))

    def test_isend_irecv(self):
        # every pair at once, small messages (buffered by the receiver until its irecv)
        sends = [dist.isend(data(RANK, 100 + q, torch.float32, 3000), q)
                 for q in range(SIZE) if q != RANK]
        got = {q: torch.empty(100 + RANK) for q in range(SIZE) if q != RANK}
        recvs = [dist.irecv(got[q], q) for q in got]
        for w in sends + recvs:
            w.wait()
        for q, t in got.items():
            self.check(t, data(q, 100 + RANK, torch.float32, 3000))
        # to itself, and into a strided tensor; the recv's future carries the tensor
        out = torch.empty(4, 3, dtype=torch.float64).t()
        s = dist.isend(data(RANK, 12, torch.float64, 3001).view(3, 4), RANK)
        r = dist.irecv(out, RANK)
        fut = r.get_future()
        s.wait()
        fut.wait()
        self.assertTrue(r.is_completed())
        self.check(out, data(RANK, 12, torch.float64, 3001).view(3, 4))
        # two messages to one peer arrive in order; tags are not matched (see python.md):
        # the recvs name them in the other order and still get the sends' order
        if SIZE >= 2:
            peer = RANK ^ 1
            if peer < SIZE:
                if RANK % 2 == 0:
                    dist.send(torch.full((3,), 1.0), peer, tag=5)
                    dist.send(torch.full((3,), 2.0), peer, tag=7)
                else:
                    a, b = torch.empty(3), torch.empty(3)
                    dist.recv(a, peer, tag=7)
                    dist.recv(b, peer, tag=5)
                    self.check(a, torch.full((3,), 1.0))
                    self.check(b, torch.full((3,), 2.0))

    def test_recv_any_source(self):
        # dist.recv(t) and dist.irecv(t) without src (the backend's recvAnysource): each rank
        # in turn takes 3 messages from every other; each message says who sent it and its
        # index among that sender's, so every one must come exactly once, from the rank the
        # call returns, and a sender's in the order it sent them
        def msg(src, k, n=11):
            return torch.cat([torch.tensor([src, k], dtype=torch.int64),
                              data(src, n - 2, torch.int64, 6000 + k)])
        for dst in range(SIZE):
            with self.subTest(receiver=dst):
                if RANK != dst:
                    for k in range(3):
                        dist.send(msg(RANK, k), dst)
                else:
                    nxt = [0] * SIZE
                    for i in range(3 * (SIZE - 1)):
                        t = torch.full((11,), -1, dtype=torch.int64)
                        if i % 2 == 0:
                            src = dist.recv(t)
                        else:
                            w = dist.irecv(t)
                            w.wait()
                            src = w._source_rank()
                        self.assertNotEqual(src, RANK)
                        self.check(t, msg(src, nxt[src]))
                        nxt[src] += 1
                    self.assertEqual(nxt, [0 if q == RANK else 3 for q in range(SIZE)])
            dist.barrier()
        # a recv naming rank 1 issued before one without src gets rank 1's first message
        if RANK == 1:
            dist.send(msg(1, 0, 5), 0)
            dist.send(msg(1, 1, 5), 0)
        elif RANK == 0:
            a, b = torch.empty(5, dtype=torch.int64), torch.empty(5, dtype=torch.int64)
            w = dist.irecv(a, 1)
            self.assertEqual(dist.recv(b), 1)
            w.wait()
            self.check(a, msg(1, 0, 5))
            self.check(b, msg(1, 1, 5))
        dist.barrier()
        # in a subgroup: the sender comes back as its global rank
        if SIZE >= 3:
            g = dist.new_group([1, 2])
            if RANK == 2:
                dist.send(msg(2, 0, 4), 1, group=g)
            elif RANK == 1:
                t = torch.empty(4, dtype=torch.int64)
                self.assertEqual(dist.recv(t, group=g), 2)
                self.check(t, msg(2, 0, 4))
            dist.barrier()
        # inside a coalescing batch gcoll refuses it (its sender is known only once a
        # message came, and a batch posts its receives before)
        with self.assertRaisesRegex(RuntimeError, "any source.*group"):
            with dist._coalescing_manager(device=torch.device("cpu")):
                dist.irecv(torch.empty(3))
        dist.barrier()

    def test_batch_isend_irecv_ring_shift(self):
        # receives first, then sends, of 4 MiB each way: only as one batch (a gcoll group)
        # can every rank's receive be posted while its send goes out
        n = 1 << 20
        nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        for rep in range(2):
            got = torch.empty(n)
            ops = [dist.P2POp(dist.irecv, got, prv),
                   dist.P2POp(dist.isend, data(RANK, n, torch.float32, 4000 + rep), nxt)]
            works = dist.batch_isend_irecv(ops)
            for w in works:
                w.wait()
            self.check(got, data(prv, n, torch.float32, 4000 + rep))
        # one batch with several peers and dtypes
        ops, want = [], []
        for q in range(SIZE):
            if q == RANK:
                continue
            for k, dtype in enumerate((torch.int8, torch.float16)):
                buf = torch.empty(5 + q + RANK, dtype=dtype)
                ops.append(dist.P2POp(dist.irecv, buf, q))
                want.append((buf, data(q, 5 + q + RANK, dtype, 4100 + k)))
                ops.append(dist.P2POp(dist.isend, data(RANK, 5 + q + RANK, dtype, 4100 + k), q))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for buf, w in want:
            self.check(buf, w)

    def test_coalescing_manager_with_device(self):
        # torch's coalescing manager with a device: the backend's startCoalescing and
        # endCoalescing make one gcoll group of whatever is issued inside
        cpu = torch.device("cpu")
        a = data(RANK, 33, torch.float32, 5000)
        b = data(RANK, 3, torch.float32, 5001)
        c = data(RANK, 9, torch.int16, 5002)
        with dist._coalescing_manager(device=cpu, async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        self.check(a, reference("sum", [data(q, 33, torch.float32, 5000) for q in range(SIZE)],
                                torch.float32))
        self.check(b, reference("sum", [data(q, 3, torch.float32, 5001) for q in range(SIZE)],
                                torch.float32))
        want_d = reference("min", [data(q, 4, torch.int64, 5003) for q in range(SIZE)],
                           torch.int64)
        d = data(RANK, 4, torch.int64, 5003)
        with dist._coalescing_manager(device=cpu, async_ops=True) as cm:
            dist.broadcast(c, src=SIZE - 1, async_op=True)
            dist.reduce(d, dst=0, op=dist.ReduceOp.MIN, async_op=True)
        cm.wait()
        self.check(c, data(SIZE - 1, 9, torch.int16, 5002))
        self.check(d, want_d if RANK == 0 else data(RANK, 4, torch.int64, 5003))
        # blocking calls inside a batch: each waits, which runs the batch so far first
        c = data(RANK, 9, torch.int16, 5004)
        d = data(RANK, 4, torch.int64, 5003)
        with dist._coalescing_manager(device=cpu):
            dist.broadcast(c, src=0)
            self.check(c, data(0, 9, torch.int16, 5004))
            dist.reduce(d, dst=SIZE - 1, op=dist.ReduceOp.MIN)
        self.check(d, want_d if RANK == SIZE - 1 else data(RANK, 4, torch.int64, 5003))
        # an empty batch
        with dist._coalescing_manager(device=cpu):
            pass
        dist.barrier()


if __name__ == "__main__":
    unittest.main()
