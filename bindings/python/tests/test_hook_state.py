# test_hook_state.py: the DDP hook's checkpoints and its non-finite modes, on the "gcoll"
# backend (no Gloo anywhere).
"""Run in two jobs on the same ranks (gcoll-run -n 2 -x MASTER_PORT=P ... ):
  GCOLL_TEST_PHASE=save    trains 4 steps, saves model, optimizer and hook state per rank
                           into $GCOLL_TEST_DIR, trains 4 more (the uninterrupted run) and
                           saves the final weights; then the non-finite cases.
  GCOLL_TEST_PHASE=resume  a new job: new process group, new communicator, a model with
                           other initial weights; loads the checkpoint, trains the same 4
                           steps and must end with the uninterrupted run's weights, bit
                           for bit; then the state_dict's refusals."""

import os
import unittest

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gcoll
import gcoll.torch as gt

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])
PHASE = os.environ.get("GCOLL_TEST_PHASE", "save")
DIR = os.environ.get("GCOLL_TEST_DIR", ".")
# error feedback (top-k), DGC's velocity, and a quantizer's server residual (sign)
SPECS = {"topk": ("topk:density=0.05", 0.9), "dgc": ("dgc:density=0.05,momentum=0.9", 0.0),
         "sign": ("sign", 0.0)}
SAVE_AT, MORE = 4, 4


def setUpModule():
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=RANK, world_size=SIZE)


def tearDownModule():
    dist.destroy_process_group()


def make_model(seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                        nn.Linear(64, 10))
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024  # bucket 0: the last layer alone
    return DDP(net, bucket_cap_mb=0.004)  # three buckets once DDP has rebuilt them


def batch(step):
    teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(1))
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1000 * step + RANK))
    return x, (x @ teacher).argmax(1)


def train(model, opt, steps):
    for t in steps:
        x, y = batch(t)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def path(kind, name):
    return os.path.join(DIR, "%s-%s-%d.pt" % (kind, name, RANK))


class TestHookState(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.comm = gcoll.Comm(size=SIZE, rank=RANK)  # root from GCOLL_ROOT

    @classmethod
    def tearDownClass(cls):
        cls.comm.close()

    @unittest.skipUnless(PHASE == "save", "save phase")
    def test_save_then_continue(self):
        for name, (spec, momentum) in SPECS.items():
            with self.subTest(spec=spec):
                model = make_model(0)
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
                hook = gt.register(model, spec, comm=self.comm)
                train(model, opt, range(SAVE_AT))
                sd = hook.state_dict()
                # one state per parameter, by name, whatever DDP's buckets were
                self.assertEqual(sorted(e["name"] for e in sd["params"]),
                                 sorted(n for n, _ in model.named_parameters()))
                self.assertEqual(sd["step"], SAVE_AT)
                self.assertTrue(all(hook.states[e["name"]].step == SAVE_AT
                                    for e in sd["params"]))
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": sd},
                           path("ckpt", name))
                train(model, opt, range(SAVE_AT, SAVE_AT + MORE))
                torch.save(weights(model), path("ref", name))
                hook.close()

    @unittest.skipUnless(PHASE == "resume", "resume phase")
    def test_resume_is_bit_identical(self):
        for name, (spec, momentum) in SPECS.items():
            with self.subTest(spec=spec):
                model = make_model(123)  # other weights: the checkpoint must replace them
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
                hook = gt.register(model, spec, comm=self.comm)
                ck = torch.load(path("ckpt", name))
                model.load_state_dict(ck["model"])
                opt.load_state_dict(ck["opt"])
                hook.load_state_dict(ck["hook"])
                # DDP's first step here has one bucket of everything, the uninterrupted
                # job's buckets were the rebuilt three: the states are per parameter
                train(model, opt, range(SAVE_AT, SAVE_AT + MORE))
                ref = torch.load(path("ref", name))
                self.assertTrue(torch.equal(weights(model), ref),
                                "%s: the resumed run differs from the uninterrupted one by "
                                "up to %g" % (spec, (weights(model) - ref).abs().max()))
                hook.close()

    @unittest.skipUnless(PHASE == "resume", "resume phase")
    def test_state_dict_refusals(self):
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = gt.register(model, "dgc:density=0.05,momentum=0.9", comm=self.comm)
        train(model, opt, range(3))
        sd = hook.state_dict()
        before = [e["state"] for e in sd["params"]]
        with self.assertRaisesRegex(ValueError, "job of 5 ranks, this one has %d" % SIZE):
            hook.load_state_dict(dict(sd, world_size=5))
        with self.assertRaisesRegex(ValueError, "rank"):
            hook.load_state_dict(dict(sd, rank=RANK + 1))
        with self.assertRaisesRegex(ValueError, "compressor"):
            hook.load_state_dict(dict(sd, spec="topk:density=0.5"))
        broken = dict(sd, params=[dict(e, state=e["state"][:-4]) for e in sd["params"]])
        with self.assertRaises(gcoll.GcollError):
            hook.load_state_dict(broken)
        # nothing changed
        self.assertEqual([e["state"] for e in hook.state_dict()["params"]], before)
        with self.assertRaisesRegex(ValueError, "accumulate_steps"):
            hook.load_state_dict(dict(sd, accumulate_steps=2))
        renamed = dict(sd, params=[dict(e, name="x" + e["name"]) for e in sd["params"]])
        with self.assertRaisesRegex(ValueError, "saved for parameters"):
            hook.load_state_dict(renamed)
        other = gt.GcollHookState("topk:density=0.05", comm=self.comm)
        with self.assertRaisesRegex(ValueError, "keyed by parameter"):
            other.load_state_dict(dict(sd, spec=other.spec))
        other.close()
        hook.close()

    def inject_inf(self, model):
        """On rank 1 only, an Inf in the last layer's bias gradient (DDP's bucket 0)."""
        last_bias = list(model.parameters())[-1]
        if RANK == 1:
            return last_bias.register_hook(lambda g: g + float("inf"))
        return None

    @unittest.skipUnless(PHASE == "save", "save phase")
    def test_nonfinite_propagate(self):
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = gt.register(model, "dgc:density=0.05,momentum=0.9", comm=self.comm,
                           nonfinite="propagate")
        train(model, opt, range(3))
        saved = {i: ts.save() for i, ts in hook.states.items()}
        handle = self.inject_inf(model)
        x, y = batch(3)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if handle:
            handle.remove()
        bias = list(model.parameters())[-1]
        # every rank sees the Inf (so a loss scaler skips the step everywhere)
        self.assertFalse(bool(torch.isfinite(bias.grad).all()), bias.grad)
        self.assertEqual(hook.nonfinite_steps, 1)
        after = {i: ts.save() for i, ts in hook.states.items()}
        # the last layer (DDP's bucket 0): residual, velocity, step untouched
        for name in ("module.4.weight", "module.4.bias"):
            self.assertEqual(after[name], saved[name])
        self.assertNotEqual(after["module.0.weight"], saved["module.0.weight"])  # finite
        # buckets ran as usual
        for p in list(model.parameters())[:2]:  # the first layer, in the last bucket
            self.assertTrue(bool(torch.isfinite(p.grad).all()))
        # the next step is finite again and runs normally
        train(model, opt, range(4, 6))
        self.assertNotEqual(hook.states["module.4.bias"].save(), saved["module.4.bias"])
        w = weights(model)
        self.assertTrue(bool(torch.isfinite(w).all()))  # the Inf step was skipped here
        everyone = [torch.empty_like(w) for _ in range(SIZE)]
        dist.all_gather(everyone, w)
        self.assertTrue(all(torch.equal(e, w) for e in everyone))
        hook.close()

    @unittest.skipUnless(PHASE == "save", "save phase")
    def test_nonfinite_raise_on_every_rank(self):
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = gt.register(model, "topk:density=0.05", comm=self.comm)  # raise: the default
        self.assertEqual(hook.nonfinite, "raise")
        train(model, opt, range(2))
        saved = {i: ts.save() for i, ts in hook.states.items()}
        handle = self.inject_inf(model)
        x, y = batch(2)
        with self.assertRaisesRegex(RuntimeError, r"NaN or infinite values in DDP bucket 0 "
                                                  r"on rank\(s\) 1"):
            nn.functional.cross_entropy(model(x), y).backward()
        if handle:
            handle.remove()
        self.assertEqual({i: ts.save() for i, ts in hook.states.items()}, saved)
        hook.close()
        # the process group and gcoll's communicator are still usable
        t = torch.ones(3)
        dist.all_reduce(t)
        self.assertTrue(torch.equal(t, torch.full((3,), float(SIZE))))
        self.comm.barrier()


if __name__ == "__main__":
    unittest.main()
