# test_comm.py: the binding's collectives on 2+ ranks, numpy and torch, run by gcoll-run.
"""Run: gcoll-run -n 2 python3 test_comm.py (PYTHONPATH and GCOLL_LIBRARY as in
test-python.sh). Every rank runs the same tests in the same order, so the collectives
match; the last test breaks the communicator on purpose."""

import os
import unittest

import numpy as np

import gcoll

try:
    import torch
except ImportError:
    torch = None

comm = None


def setUpModule():
    global comm
    comm = gcoll.Comm()


def tearDownModule():
    comm.close()


def rank_grad(n, rank, seed=3):
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


class TestComm(unittest.TestCase):
    def test_00_identity(self):
        self.assertGreaterEqual(comm.size, 2)
        self.assertIn(comm.rank, range(comm.size))
        # auto: UCX's shared memory when gcoll-run puts every rank on this host, else TCP
        want = os.environ.get("GCOLL_TRANSPORT", "auto")
        if want == "auto":
            one_host = os.environ.get("GCOLL_LOCAL_SIZE") == os.environ.get("GCOLL_SIZE")
            want = "ucx" if one_host and "ucx" in gcoll.transports_built() else "tcp"
        self.assertEqual(comm.transport, want)
        self.assertEqual(comm.last_error, "")

    def test_01_allreduce_numpy(self):
        P, r = comm.size, comm.rank
        x = np.full(1003, r + 1, np.float32)
        self.assertIs(comm.allreduce(x), x)  # in place
        np.testing.assert_array_equal(x, np.full(1003, P * (P + 1) / 2, np.float32))
        y = np.arange(10, dtype=np.int64) * (r + 1)
        out = np.empty_like(y)
        comm.allreduce(y, out, op="max")
        np.testing.assert_array_equal(out, np.arange(10) * P)
        z = np.full(5, float(r), np.float64)
        comm.allreduce(z, op=gcoll.AVG)
        np.testing.assert_array_equal(z, np.full(5, (P - 1) / 2))

    @unittest.skipIf(torch is None, "torch not importable")
    def test_02_allreduce_torch(self):
        P, r = comm.size, comm.rank
        t = torch.full((4, 257), float(r + 1))
        ptr = t.data_ptr()
        comm.allreduce(t, op="avg")
        self.assertEqual(t.data_ptr(), ptr)
        self.assertTrue(torch.equal(t, torch.full((4, 257), (P + 1) / 2)))
        h = torch.full((100,), float(r + 1), dtype=torch.bfloat16)
        comm.allreduce(h)
        self.assertTrue(torch.equal(h.float(), torch.full((100,), float(P * (P + 1) // 2))))
        req = comm.iallreduce(torch.ones(7), torch.zeros(7))
        self.assertTrue(torch.equal(req.wait(), torch.full((7,), float(P))))
        self.assertTrue(req.done)

    def test_03_broadcast_barrier_allgather(self):
        P, r = comm.size, comm.rank
        for root in range(P):
            b = np.arange(33, dtype=np.int32) * (r + 1)
            comm.broadcast(b, root=root)
            np.testing.assert_array_equal(b, np.arange(33) * (root + 1))
        req = comm.ibroadcast(np.full(3, r, np.float32), root=P - 1)
        np.testing.assert_array_equal(req.wait(), np.full(3, P - 1))
        comm.barrier()
        comm.ibarrier().wait()
        g = np.empty(2 * P, np.float32)
        comm.allgather(np.array([r, -r], np.float32), g)
        np.testing.assert_array_equal(g, np.array([[i, -i] for i in range(P)]).ravel())

    def test_04_sparse_allreduce(self):
        P, r = comm.size, comm.rank
        idx = np.array([r, 50, 50], np.uint32)  # repeats add
        val = np.array([1.0, 0.5, 0.5], np.float32)
        out = np.full(64, 7.0, np.float32)
        comm.sparse_allreduce(idx, val, out)
        want = np.zeros(64, np.float32)
        want[:P] = 1
        want[50] = P
        np.testing.assert_array_equal(out, want)
        if torch is not None:
            o = torch.zeros(64)
            comm.isparse_allreduce(torch.tensor([r], dtype=torch.int32), torch.ones(1), o,
                                   op="avg").wait()
            self.assertEqual(o.sum().item(), 1.0)

    def test_05_compressed_allreduce(self):
        P, r = comm.size, comm.rank
        n = 5000
        for spec in ("none", "topk:density=0.01", "dgc:density=0.01", "sign", "fp16",
                     "randomk:density=0.02,seed=5"):
            with self.subTest(spec=spec):
                c = gcoll.Compressor(spec)
                s1, s2 = c.state(n), c.state(n)
                for step in range(3):
                    g = rank_grad(n, r, step)
                    out = comm.compressed_allreduce(s1, g, np.empty_like(g), op="avg")
                    req = comm.icompressed_allreduce(s2, g.copy(), op="avg")
                    out2 = req.wait()
                    # blocking and nonblocking give the same bits, in place or not
                    np.testing.assert_array_equal(out, out2)
                    self.assertEqual(s1.step, step + 1)
                # every rank got the same bits
                everyone = np.empty(P * n, np.float32)
                comm.allgather(out, everyone)
                for q in range(P):
                    np.testing.assert_array_equal(everyone[q * n:(q + 1) * n], out)

    def test_06_compressed_is_exact_for_none(self):
        P, r = comm.size, comm.rank
        g = rank_grad(999, r)
        out = comm.compressed_allreduce(gcoll.TensorState("none", 999), g, np.empty_like(g))
        total = sum(rank_grad(999, q) for q in range(P))
        np.testing.assert_allclose(out, total, rtol=1e-5, atol=1e-6)

    def test_07_counters(self):
        before = comm.counters()
        x = np.ones(1 << 16, np.float32)
        comm.allreduce(x)
        after = comm.counters()
        self.assertEqual(after.ops, before.ops + 1)
        self.assertGreaterEqual(after.bytes_sent - before.bytes_sent, x.nbytes // comm.size)
        self.assertIn("bytes_sent", after.as_dict())

    def test_08_argument_errors_leave_comm_usable(self):
        st = gcoll.TensorState("topk:density=0.1", 10)
        with self.assertRaisesRegex(ValueError, "grad has 11 elements"):
            comm.compressed_allreduce(st, np.zeros(11, np.float32))
        with self.assertRaisesRegex(TypeError, "float64"):
            comm.compressed_allreduce(st, np.zeros(10))
        with self.assertRaisesRegex(ValueError, "unknown op"):
            comm.allreduce(np.zeros(3, np.float32), op="mean")
        with self.assertRaisesRegex(ValueError, "read-only"):
            a = np.zeros(3, np.float32)
            a.flags.writeable = False
            comm.allreduce(a)
        with self.assertRaisesRegex(TypeError, "indices must be uint32"):
            comm.sparse_allreduce(np.zeros(1, np.int64), np.zeros(1, np.float32),
                                  np.zeros(4, np.float32))
        # rejected by gcoll itself (GCOLL_ERR_INVALID, before anything is sent)
        with self.assertRaises(gcoll.GcollError) as cm:
            comm.compressed_allreduce(st, np.full(10, np.inf, np.float32))
        e = cm.exception
        self.assertEqual(e.status_name, "GCOLL_ERR_INVALID")
        self.assertIn("NaN or infinite", str(e))
        self.assertIn("NaN or infinite", comm.last_error)
        comm.barrier()  # still usable

    def test_09_rooted(self):
        """reduce, gather and scatter against numpy on every root (int64 sums: exact)."""
        P, r = comm.size, comm.rank
        for root in range(P):
            x = np.arange(7, dtype=np.int64) * (r + 1)
            out = np.zeros(7, np.int64) if r == root else None
            got = comm.reduce(x, out, op="sum", root=root)
            if r == root:
                np.testing.assert_array_equal(got, np.arange(7) * (P * (P + 1) // 2))
            else:
                self.assertIsNone(got)
            g = np.full(3, r, np.uint8)
            all_ = np.zeros(3 * P, np.uint8) if r == root else None
            got = comm.igather(g, all_, root=root).wait()
            if r == root:
                np.testing.assert_array_equal(got, np.repeat(np.arange(P, dtype=np.uint8), 3))
            src = np.arange(2 * P, dtype=np.float32) + 100 * root if r == root else None
            mine = comm.scatter(src, np.zeros(2, np.float32), root=root)
            np.testing.assert_array_equal(mine, np.array([2 * r, 2 * r + 1]) + 100 * root)
        with self.assertRaises(ValueError):
            comm.reduce(np.zeros(2, np.float32), None, root=P)

    def test_10_send_recv_and_groups(self):
        """A ring shift of blocking calls inside comm.group(), then pairwise isend/irecv
        (every pair, in order), with numpy and torch."""
        P, r = comm.size, comm.rank
        right, left = (r + 1) % P, (r - 1) % P
        got = np.zeros(5, np.float64)
        with comm.group():
            comm.send(np.full(5, r, np.float64), right)
            comm.recv(got, left)
        np.testing.assert_array_equal(got, np.full(5, left, np.float64))
        for a in range(P):
            for b in range(P):
                if a == b or r not in (a, b):
                    continue
                if r == a:
                    comm.isend(np.array([a, b, 1], np.int32), b).wait()
                    comm.send(np.array([a, b, 2], np.int32), b)
                else:
                    first = comm.irecv(np.zeros(3, np.int32), a)
                    second = comm.recv(np.zeros(3, np.int32), a)
                    np.testing.assert_array_equal(first.wait(), [a, b, 1])
                    np.testing.assert_array_equal(second, [a, b, 2])
        if torch is not None:
            t = torch.zeros(4, dtype=torch.bfloat16)
            with comm.group():
                comm.send(torch.full((4,), float(r), dtype=torch.bfloat16), right)
                comm.recv(t, left)
            self.assertTrue(torch.equal(t, torch.full((4,), float(left), dtype=torch.bfloat16)))
        with self.assertRaises(ValueError):
            comm.send(np.zeros(1, np.float32), P)
        # from any source: every other rank sends rank 0 two messages [sender, index]; each
        # comes once, from the rank recv_any returns, in its sender's order
        if r != 0:
            for k in range(2):
                comm.send(np.array([r, k], np.int64), 0)
        else:
            nxt = [0] * P
            for _ in range(2 * (P - 1)):
                m = np.full(2, -1, np.int64)
                src = comm.recv_any(m)
                np.testing.assert_array_equal(m, [src, nxt[src]])
                nxt[src] += 1
            self.assertEqual(nxt, [0] + [2] * (P - 1))
        with self.assertRaises(gcoll.GcollError):
            with comm.group():
                comm.recv_any(np.zeros(1, np.float32))

    def test_99_mismatch_breaks_comm(self):
        # ranks pass different counts: every rank gets GCOLL_ERR_MISMATCH with gcoll's message
        with self.assertRaises(gcoll.GcollError) as cm:
            comm.allreduce(np.zeros(3 + comm.rank, np.float32))
        e = cm.exception
        self.assertEqual(e.status_name, "GCOLL_ERR_MISMATCH")
        self.assertIn("ranks disagree", e.message)
        self.assertIn("ranks disagree", comm.last_error)
        with self.assertRaises(gcoll.GcollError) as cm:
            comm.barrier()
        self.assertEqual(cm.exception.status_name, "GCOLL_ERR_ABORTED")


if __name__ == "__main__":
    unittest.main()
