# test_localsgd.py: gcoll.localsgd.LocalSGD and gcoll.ps.ParameterServer on 2 ranks with torch
# (run by test-localsgd.sh).
"""Run: gcoll-run -n 2 python3 test_localsgd.py (PYTHONPATH at bindings/python). Every rank
runs the same tests in the same order."""

import unittest

import numpy as np
import torch

import gcoll
from gcoll.localsgd import LocalSGD
from gcoll.ps import ParameterServer

comm = None


def setUpModule():
    global comm
    comm = gcoll.Comm()


def tearDownModule():
    comm.close()


def model(seed=1):
    torch.manual_seed(seed)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def local_step(m, opt, rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(4, 8, generator=g)
    y = torch.randint(0, 3, (4,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()


def gathered(m):
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()
    out = np.empty(flat.size * comm.size, dtype=np.float32)
    comm.allgather(flat, out)
    return out.reshape(comm.size, -1)


class TestLocalSGD(unittest.TestCase):
    def test_00_sync_every_h(self):
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        ls = LocalSGD(m.parameters(), comm, local_steps=3)
        flags = []
        for s in range(6):
            local_step(m, opt, comm.rank, s)
            flags.append(ls.step())
        self.assertEqual(flags, [False, False, True, False, False, True])
        g = gathered(m)
        self.assertTrue(np.array_equal(g[0], g[1]))  # every rank holds the synced model
        self.assertEqual(ls.info()["syncs"], 2)
        ls.close()

    def test_01_state_dict(self):
        m1, m2 = model(), model()
        o1 = torch.optim.SGD(m1.parameters(), lr=0.1)
        o2 = torch.optim.SGD(m2.parameters(), lr=0.1)
        l1 = LocalSGD(m1.parameters(), comm, local_steps=2, compressor="topk:density=0.2")
        for s in range(5):
            local_step(m1, o1, comm.rank, s)
            l1.step()
        sd = l1.state_dict()
        self.assertEqual(sd["info"]["steps"], 5)
        self.assertTrue(any(float(r.abs().sum()) > 0 for r in sd["residual"]))
        with torch.no_grad():
            for a, b in zip(m2.parameters(), m1.parameters()):
                a.copy_(b)
        l2 = LocalSGD(m2.parameters(), comm, local_steps=2, compressor="topk:density=0.2")
        l2.load_state_dict(sd)
        for s in range(5, 9):
            local_step(m1, o1, comm.rank, s)
            l1.step()
            local_step(m2, o2, comm.rank, s)
            l2.step()
        for a, b in zip(m1.parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b))
        l1.close()
        l2.close()

    def test_02_momentum_reset_and_bad_args(self):
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        ls = LocalSGD(m.parameters(), comm, local_steps=1, momentum="reset", optimizer=opt)
        local_step(m, opt, comm.rank, 0)
        self.assertTrue(ls.step())
        for p in m.parameters():
            self.assertEqual(float(opt.state[p]["momentum_buffer"].abs().sum()), 0.0)
        ls.close()
        with self.assertRaises(ValueError):
            LocalSGD(m.parameters(), comm, momentum="average")  # no optimizer
        with self.assertRaises(gcoll.GcollError):
            LocalSGD(m.parameters(), comm, local_steps=0)

    def test_03_parameter_server(self):
        m = model()
        ps = ParameterServer(m.parameters(), comm, staleness=1, lr=0.1,
                             compressor="topk:density=0.5")
        ps.start()
        for s in range(20):
            ps.pull()
            g = torch.Generator().manual_seed(100 * comm.rank + s)
            x = torch.randn(4, 8, generator=g)
            y = torch.randint(0, 3, (4,), generator=g)
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            ps.push([p.grad for p in m.parameters()])
        ps.finish()
        st = ps.stats()
        self.assertEqual(st["clock"], 20)
        self.assertLessEqual(st["max_gap"], 1)
        self.assertEqual(st["applied"], 20 * comm.size * comm.size)
        g = gathered(m)
        self.assertTrue(np.array_equal(g[0], g[1]))  # the final model on every rank
        ps.close()

    def test_04_parameter_server_compressed_pulls_dc(self):
        m = model()
        ps = ParameterServer(m.parameters(), comm, staleness=2, lr=0.1,
                             compressor="topk:density=0.5", pull_compressor="q8",
                             dc_lambda=0.1)
        ps.start()
        for s in range(20):
            ps.pull()
            g = torch.Generator().manual_seed(100 * comm.rank + s)
            x = torch.randn(4, 8, generator=g)
            y = torch.randint(0, 3, (4,), generator=g)
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            ps.push([p.grad for p in m.parameters()])
        ps.finish()
        st = ps.stats()
        self.assertLessEqual(st["max_gap"], 2)
        self.assertEqual(st["applied"], 20 * comm.size * comm.size)
        g = gathered(m)
        self.assertTrue(np.array_equal(g[0], g[1]))
        ps.close()
        with self.assertRaises(gcoll.GcollError):
            ParameterServer(m.parameters(), comm, pull_compressor="randomk:density=0.1")
        with self.assertRaises(gcoll.GcollError):
            ParameterServer(m.parameters(), comm, dc_lambda=-1.0)

    def test_05_parameter_server_prefetch(self):
        # prefetched pulls (the answer to the previous pull's request, staged until this
        # pull) keep the bound S, and every update is applied
        m = model()
        ps = ParameterServer(m.parameters(), comm, staleness=1, lr=0.1, pull_compressor="q8",
                             prefetch=True)
        ps.start()
        for s in range(20):
            ps.pull()
            g = torch.Generator().manual_seed(100 * comm.rank + s)
            x = torch.randn(4, 8, generator=g)
            y = torch.randint(0, 3, (4,), generator=g)
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            ps.push([p.grad for p in m.parameters()])
        ps.finish()
        st = ps.stats()
        self.assertEqual(st["clock"], 20)
        self.assertLessEqual(st["max_gap"], 1)
        self.assertEqual(st["applied"], 20 * comm.size * comm.size)
        self.assertGreater(st["mean_staleness"], 0.0)  # the own last update is never in
        g = gathered(m)
        self.assertTrue(np.array_equal(g[0], g[1]))
        ps.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
