# test_backend_lifecycle.py: the "gcoll" backend's timeouts, abort, shutdown and re-init.
"""Run: gcoll-run -n 2 -x MASTER_PORT=P python3 test_backend_lifecycle.py (2 ranks or more).

The tests run in order (their names are numbered) and each leaves both ranks in step:
1. new_group(timeout=) governs that group's collectives: rank 0 reduces alone on a group
   with a 3 s timeout and gets the timeout error after about 3 s (not the default group's
   60 s, nor a hang); the other ranks' next call on the group and their
   destroy_process_group(group) return within that timeout.
2. abort (torch's _abort_process_group): a reduction in flight on rank 0 fails with
   GCOLL_ERR_ABORTED as soon as rank 0 aborts the group (its timeout is 60 s), the backend
   refuses later calls, and the peers' calls fail without waiting for the timeout.
3. destroy_process_group() then a fresh init_process_group (file://, timeout=3 s): the new
   communicator works, and the 3 s bound governs its collectives.
GCOLL_TIMEOUT_MS is left unset here: the group's timeout alone bounds the waits."""

import datetime
import os
import tempfile
import time
import unittest

import torch
import torch.distributed as dist

import gcoll.torch  # noqa: F401  (registers the backend)

RANK = int(os.environ["GCOLL_RANK"])
SIZE = int(os.environ["GCOLL_SIZE"])
CPU = torch.device("cpu")
SHORT = 3.0  # seconds: the short timeouts under test
LONG = 60.0  # seconds: a timeout the tests must finish well within


def td(s):
    return datetime.timedelta(seconds=s)


def setUpModule():
    os.environ.pop("GCOLL_TIMEOUT_MS", None)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    torch.set_num_threads(1)
    dist.init_process_group("gcoll", rank=RANK, world_size=SIZE, timeout=td(LONG))


def tearDownModule():
    if dist.is_initialized():
        dist.destroy_process_group()


class TestLifecycle(unittest.TestCase):
    def assert_fails_within(self, fn, regex, lo, hi):
        t0 = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, regex):
            fn()
        el = time.monotonic() - t0
        self.assertGreaterEqual(el, lo, "failed after %.2f s, before the timeout" % el)
        self.assertLess(el, hi, "failed after %.2f s" % el)
        return el

    def test_1_new_group_timeout(self):
        g = dist.new_group(list(range(SIZE)), timeout=td(SHORT))
        t = torch.ones(3)
        dist.all_reduce(t, group=g)  # the group works
        self.assertTrue(torch.equal(t, torch.full((3,), float(SIZE))))
        if RANK == 0:
            # gcoll's timeout counts time without progress: at least the timeout, and
            # far less than the default group's 60 s
            self.assert_fails_within(lambda: dist.all_reduce(torch.ones(3), group=g),
                                     "TIMEOUT.*new_group\\(timeout=\\)", 0.8 * SHORT, SHORT + 20)
        dist.barrier()  # on the default group, which stays sound
        if RANK != 0:
            # the reduction rank 0 gave up on: rank 0's data may have reached this rank
            # before it broke the group (then it completes here), else rank 0's notice
            # fails it; either way within the group's timeout, never a hang
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(3), group=g)
            except RuntimeError as e:
                self.assertIn("gcoll backend: all_reduce failed", str(e))
            self.assertLess(time.monotonic() - t0, SHORT + 20)
        t0 = time.monotonic()
        dist.destroy_process_group(g)
        self.assertLess(time.monotonic() - t0, SHORT + 10)  # bounded by the group's timeout
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertTrue(torch.equal(t, torch.full((2,), float(SIZE))))

    def test_2_abort(self):
        g = dist.new_group(list(range(SIZE)), timeout=td(LONG))
        dist.all_reduce(torch.ones(2), group=g)
        b = g._get_backend(CPU)
        if RANK == 0:
            w = dist.all_reduce(torch.ones(2), group=g, async_op=True)  # the peers never join
            time.sleep(0.5)
            t0 = time.monotonic()
            dist.distributed_c10d._abort_process_group(g)
            with self.assertRaisesRegex(RuntimeError, "GCOLL_ERR_ABORTED"):
                w.wait()
            self.assertLess(time.monotonic() - t0, 15)  # not the group's 60 s
            self.assertTrue(w.is_completed())
            with self.assertRaisesRegex(RuntimeError, "shut down or aborted"):
                b.allreduce([torch.ones(2)])
        dist.barrier()
        if RANK != 0:
            # the first reduction matches the one rank 0 had started (its data may be here
            # already); the second cannot complete, and rank 0's abort notice fails it well
            # before the group's 60 s
            def two():
                dist.all_reduce(torch.ones(2), group=g)
                dist.all_reduce(torch.ones(2), group=g)
            self.assert_fails_within(two, "gcoll backend: all_reduce failed", 0, 20)
            dist.destroy_process_group(g)
        dist.barrier()

    def test_3_destroy_and_fresh_group_with_timeout(self):
        dist.destroy_process_group()
        self.assertFalse(dist.is_initialized())
        path = os.path.join(tempfile.gettempdir(),
                            "gcoll-lifecycle-%s" % os.environ["MASTER_PORT"])
        dist.init_process_group("gcoll", init_method="file://" + path, rank=RANK,
                                world_size=SIZE, timeout=td(SHORT))
        self.assertEqual(dist.get_backend(), "gcoll")
        t = torch.arange(4.0) + RANK
        dist.all_reduce(t)  # a fresh communicator
        self.assertTrue(torch.equal(t, torch.arange(4.0) * SIZE + sum(range(SIZE))))
        if RANK == 0:
            self.assert_fails_within(lambda: dist.all_reduce(torch.ones(3)),
                                     "TIMEOUT.*init_process_group\\(timeout=\\)", 0.8 * SHORT,
                                     SHORT + 20)
        else:
            time.sleep(SHORT + 2)  # past rank 0's timeout: its abort notice is here
        dist.destroy_process_group()
        if RANK == 0 and os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
