# torch_suite.py: PyTorch's own distributed tests (the suite test_distributed_spawn.py runs,
# shipped in the wheel as torch.testing._internal.distributed.distributed_test) on one
# backend, for a selection of them; run-torch-suite.sh runs it for gloo and gcoll.
"""Usage: BACKEND=gloo|gcoll WORLD_SIZE=2 python torch_suite.py [--short] [--list] [REGEX...]

Runs each selected test of DistributedTest._DistTestBase as test_distributed_spawn.py does
(every rank a spawned process, init through a file:// store), and prints one line per test
("PASS name", "FAIL name", "SKIP name: reason") and a last line
"torch-suite BACKEND: P passed, F failed, S skipped of N". The selection: the collective,
rooted, point-to-point, object, subgroup and DDP tests that do not need a GPU (CATEGORIES
below); --short a handful of them; REGEX arguments narrow it further."""

import os
import re
import sys
import tempfile
import time
import unittest

BACKEND = os.environ.setdefault("BACKEND", "gcoll")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="torch-suite-"))
if BACKEND == "gcoll":
    import gcoll.torch  # noqa: F401  (registers "gcoll", in the spawned ranks too)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

# What the comparison covers, by test name; tests that need a GPU, NCCL, UCC or a
# profiler, and the DDP features unrelated to the backend, are left out.
CATEGORIES = {
    "collective": r"^test_(all_reduce|allreduce|all_gather|allgather|broadcast|reduce_scatter"
                  r"|all_to_all|alltoall|barrier)",
    "rooted": r"^test_(reduce|gather|scatter)(_|$)",
    "point-to-point": r"^test_(send_recv|isend|irecv|batch_isend_irecv)",
    "object": r"_object",
    "subgroup": r"^test_(new_subgroups|get_backend|destroy_group|destroy_full_group"
                r"|get_rank_size_(full_)?group|ddp_update_process_group)",
    "ddp": r"^test_(DistributedDataParallel|ddp)",
}
EXCLUDE = (r"(cuda|gpu|nccl|_ucc|profil|hook_|sparse|_mixed|static_graph|logging|join|_uneven"
           r"|monitored|debug|_bwd|checkpoint|compile|device_mesh|SyncBatchNorm|sync_batch"
           r"|grad_is_view|namedtuple|pack_padded|ignore_params|detect|stress|timeout"
           r"|non_default_stream|sync_bn)")
SHORT = ["test_all_reduce_sum", "test_broadcast", "test_all_gather", "test_all_to_all",
         "test_barrier", "test_all_gather_object_default_pg", "test_DistributedDataParallelCPU",
         "test_send_recv_any_source"]


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


# Tests torch's suite runs for Gloo alone although they use nothing of Gloo's (CPU
# batch_isend_irecv, "GLOO Batch Send Recv CPU"; scatter_object_list, gated to gloo by
# name): gcoll runs their bodies too, so the comparison covers them.
GLOO_NAMED = ["test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
              "test_scatter_object_list"]


def _unskipped(f):
    def run(self):
        return f(self)
    run.__name__ = f.__name__
    return run


if BACKEND == "gcoll":
    for _n in GLOO_NAMED:
        setattr(TestDistBackendWithSpawn, _n,
                _unskipped(getattr(DistributedTest._DistTestBase, _n)))


def selection(args):
    names = sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))
    if "--short" in args:
        return [n for n in SHORT if n in names]
    pats = [a for a in args if not a.startswith("--")]
    out = []
    for cat, pat in CATEGORIES.items():
        for n in names:
            if re.search(pat, n) and not re.search(EXCLUDE, n) and n not in out and \
                    all(re.search(p, n) for p in pats):
                out.append(n)
    return out


def line(kind, name, why):
    """One result line, printed at once: a run cut short by its time limit keeps what it
    finished."""
    if why and not isinstance(why, str):
        why = " ".join(why)
    print("%s %s%s" % (kind, name, (": %s" % why)[:200] if why else ""), flush=True)


class Result(unittest.TextTestResult):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.lines = []

    def stopTest(self, test):
        super().stopTest(test)
        if self.lines and self.lines[-1][1] == test._testMethodName:
            line(*self.lines[-1])

    def addSuccess(self, test):
        super().addSuccess(test)
        self.lines.append(("PASS", test._testMethodName, ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.lines.append(("FAIL", test._testMethodName, str(err[1]).splitlines()[-1:]))

    def addError(self, test, err):
        super().addError(test, err)
        self.lines.append(("FAIL", test._testMethodName, str(err[1]).splitlines()[-1:]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.lines.append(("SKIP", test._testMethodName, reason))


def main():
    names = selection(sys.argv[1:])
    if "--list" in sys.argv:
        print("\n".join(names))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    t0 = time.time()
    with open(os.devnull, "w") as quiet:
        res = unittest.TextTestRunner(stream=quiet, resultclass=Result).run(suite)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for kind, name, why in res.lines:
        counts[kind] += 1
    print("torch-suite %s: %d passed, %d failed, %d skipped of %d (%.0f s)"
          % (BACKEND, counts["PASS"], counts["FAIL"], counts["SKIP"], len(names),
             time.time() - t0))
    return 0 if counts["FAIL"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
