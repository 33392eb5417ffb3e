# test_ddp_backend.py: DistributedDataParallel with no hook on the "gcoll" backend alone.
"""Run: gcoll-run -n 2 -x MASTER_PORT=P python3 test_ddp_backend.py. The process group is
made with init_process_group("gcoll", rank=r, world_size=n) and MASTER_ADDR/MASTER_PORT;
there is no Gloo group anywhere in the process. GCOLL_JOB_KEY (set by gcoll-run) stays in
the environment: the backend then uses it instead of a key from the Store."""

import os
import unittest

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll.torch  # noqa: F401  (registers the backend)

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])


def setUpModule():
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=RANK, world_size=SIZE)


def tearDownModule():
    dist.destroy_process_group()


class TestDDPBackend(unittest.TestCase):
    def test_ddp_weights_identical_after_30_steps(self):
        self.assertEqual(dist.get_backend().lower(), "gcoll")
        torch.manual_seed(RANK)  # different initial weights: DDP's broadcast must fix them
        net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                            nn.Linear(64, 5))
        first = dist._DEFAULT_FIRST_BUCKET_BYTES
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
        model = DDP(net, bucket_cap_mb=0.01)  # several buckets once rebuilt
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(100 + RANK)  # each rank its own samples
        teacher = torch.randn(20, 5, generator=torch.Generator().manual_seed(7))
        pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        ops0 = pg.counters()["ops"]
        losses = []
        for _ in range(30):
            x = torch.randn(32, 20, generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertLess(sum(losses[-5:]), 0.8 * sum(losses[:5]), losses)
        # every bucket of every step went through gcoll
        self.assertGreaterEqual(pg.counters()["ops"] - ops0, 30 * 2)
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [torch.empty_like(w) for _ in range(SIZE)]
        dist.all_gather(everyone, w)
        for q in range(SIZE):
            self.assertTrue(torch.equal(everyone[q], w), "rank %d's weights differ" % q)
        # the gradient DDP applied is the average of the ranks' gradients
        x = torch.randn(8, 20, generator=g)
        opt.zero_grad()
        model(x).sum().backward()
        mine = [p.grad.clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
        model.module(x).sum().backward()  # local gradient, outside DDP
        for avg, p in zip(mine, model.parameters()):
            local = p.grad.clone()
            dist.all_reduce(local)
            torch.testing.assert_close(avg, local / SIZE, rtol=1e-5, atol=1e-6)

    def test_powersgd_hook(self):
        # torch's PowerSGD hook issues collectives inside Future callbacks and waits on
        # them there: it hung on the torch 1.13 backend. Rank 1 of the compression is
        # lossy, so the check is that training runs, the weights agree bit for bit on every
        # rank (every rank applies the same decompressed gradient), and the loss falls.
        # One bucket (DDP's default caps): with several, the hook's callbacks of one bucket
        # issue collectives while the next bucket's hook issues its own, in an order that
        # differs from rank to rank, on any backend whose Futures complete asynchronously
        # (Gloo's too); gcoll then reports GCOLL_ERR_MISMATCH or the timeout.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
        model = DDP(net)
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                   start_powerSGD_iter=3, min_compression_rate=0.5,
                                   use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(200 + RANK)
        teacher = torch.randn(20, 5, generator=torch.Generator().manual_seed(8))
        losses = []
        for _ in range(20):
            x = torch.randn(32, 20, generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertGreater(state.iter, 3)  # the compressed path ran
        self.assertLess(sum(losses[-5:]), sum(losses[:5]), losses)
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [torch.empty_like(w) for _ in range(SIZE)]
        dist.all_gather(everyone, w)
        for q in range(SIZE):
            self.assertTrue(torch.equal(everyone[q], w), "rank %d's weights differ" % q)

    def test_zero_redundancy_optimizer(self):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        torch.manual_seed(RANK)
        net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
        model = DDP(net)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=0.05)
        g = torch.Generator().manual_seed(300 + RANK)
        for _ in range(5):
            x = torch.randn(16, 10, generator=g)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [torch.empty_like(w) for _ in range(SIZE)]
        dist.all_gather(everyone, w)
        for q in range(SIZE):
            self.assertTrue(torch.equal(everyone[q], w), "rank %d's weights differ" % q)


if __name__ == "__main__":
    unittest.main()
