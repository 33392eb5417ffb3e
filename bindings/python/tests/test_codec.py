# test_codec.py: the binding's codec layer in one process: round trips, states, errors.
"""Run: PYTHONPATH=bindings/python GCOLL_LIBRARY=.libs/libgcoll.so python3 -m unittest
test_codec (from bindings/python/tests), or through tests/integration/test-python.sh."""

import unittest

import numpy as np

import gcoll

try:
    import torch
except ImportError:  # the torch cases skip; the rest still run
    torch = None


def grad(n, seed=1):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


class TestCodec(unittest.TestCase):
    def test_spec_is_canonical(self):
        c = gcoll.Compressor("topk:density=0.01")
        self.assertTrue(c.spec.startswith("topk:density=0.01"))
        self.assertEqual(gcoll.Compressor(c.spec).spec, c.spec)
        self.assertTrue(c.is_sparse)
        self.assertTrue(gcoll.Compressor("none").is_lossless)
        self.assertTrue(gcoll.Compressor("dgc:density=0.01").needs_state)

    def test_lossless_round_trip(self):
        c = gcoll.Compressor("none")
        x = grad(1001)
        msg = c.encode(x)
        self.assertIsInstance(msg, bytes)
        self.assertLessEqual(len(msg), c.bound(x.size))
        self.assertEqual(c.decode_info(msg), (x.size, x.size))
        np.testing.assert_array_equal(c.decode(msg), x)

    def test_fp16_round_trip(self):
        c = gcoll.Compressor("fp16")
        x = grad(777)
        y = c.decode(c.encode(x), np.empty_like(x))
        np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))

    def test_error_feedback_is_exact_for_topk(self):
        # e += g; c = C(e); e -= D(c): what was sent plus the residual is the input.
        c = gcoll.Compressor("topk:density=0.05")
        st = gcoll.TensorState(c, 2000)
        x = grad(2000)
        msg = c.encode(x, st)
        self.assertEqual(st.step, 1)
        sent = c.decode(msg)
        self.assertEqual(np.count_nonzero(sent), 100)
        np.testing.assert_array_equal(sent + st.residual(), x)
        # the largest magnitudes were sent
        self.assertGreaterEqual(np.abs(sent).max(), np.abs(x).max())
        idx, val = c.decode_pairs(msg)
        self.assertEqual(idx.dtype, np.uint32)
        np.testing.assert_array_equal(sent[idx], val)
        # the next step sends from input + residual
        msg2 = c.encode(x, st)
        np.testing.assert_array_equal(c.decode(msg2) + st.residual(), x + (x - sent))

    def test_decode_accumulates(self):
        c = gcoll.Compressor("none")
        x = grad(64)
        out = np.ones(64, np.float32)
        c.decode(c.encode(x), out, accumulate=True)
        np.testing.assert_array_equal(out, x + 1)

    def test_chunks(self):
        c = gcoll.Compressor("topk:density=0.1")
        st = gcoll.TensorState(c, 100)
        x = grad(100)
        first, second = c.encode_chunk(st, 0, x[:50]), c.encode_chunk(st, 50, x[50:])
        self.assertEqual(c.decode_info(first), (50, 5))
        self.assertEqual(c.decode_info(second), (50, 5))
        self.assertEqual(st.step, 0)
        st.advance()
        self.assertEqual(st.step, 1)

    def test_dgc_needs_state(self):
        c = gcoll.Compressor("dgc:density=0.01")
        with self.assertRaises(gcoll.GcollError) as cm:
            c.encode(grad(1000))
        self.assertEqual(cm.exception.status_name, "GCOLL_ERR_INVALID")
        st = c.state(1000)
        c.encode(grad(1000), st)
        self.assertEqual(st.step, 1)

    @unittest.skipIf(torch is None, "torch not importable")
    def test_torch_tensors(self):
        c = gcoll.Compressor("none")
        t = torch.randn(300)
        out = torch.zeros(300)
        self.assertIs(c.decode(c.encode(t), out), out)
        self.assertTrue(torch.equal(out, t))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "densty"):
            gcoll.Compressor("topk:densty=0.1")
        with self.assertRaises(ValueError):
            gcoll.check_spec("nosuchcodec")
        gcoll.check_spec("sign:scale=l2")
        c = gcoll.Compressor("topk:density=0.1")
        with self.assertRaisesRegex(TypeError, "float64"):
            c.encode(np.zeros(10))
        with self.assertRaisesRegex(ValueError, "contiguous"):
            c.encode(grad(20)[::2])
        with self.assertRaisesRegex(TypeError, "list"):
            c.encode([1.0, 2.0])
        st = c.state(10)
        with self.assertRaises(gcoll.GcollError):  # count differs from the state's
            c.encode(grad(11), st)
        with self.assertRaisesRegex(ValueError, "another Compressor"):
            gcoll.Compressor("sign").encode(grad(10), st)
        bad = np.full(10, np.nan, np.float32)
        with self.assertRaises(gcoll.GcollError) as cm:
            c.encode(bad, st)
        self.assertEqual(cm.exception.status, -1)
        self.assertEqual(st.step, 0)  # state unchanged on error
        with self.assertRaises(gcoll.GcollError):  # truncated message
            c.decode(c.encode(grad(10))[:-3], np.zeros(10, np.float32))
        with self.assertRaises(gcoll.GcollError):  # wrong size
            c.decode(c.encode(grad(10)), np.zeros(9, np.float32))
        if torch is not None:
            with self.assertRaisesRegex(ValueError, "contiguous"):
                c.encode(torch.zeros(4, 4).t())
            with self.assertRaisesRegex(TypeError, "int64"):
                c.encode(torch.zeros(4, dtype=torch.int64))

    def test_state_save_load_continues_bit_for_bit(self):
        rng = np.random.default_rng(3)
        for spec in ("topk:density=0.1", "topk:density=0.1,select=reuse",
                     "dgc:density=0.1,momentum=0.9", "qsgd:bits=4", "sign", "none"):
            with self.subTest(spec=spec):
                c = gcoll.Compressor(spec)
                a, b = c.state(500), c.state(500)
                for _ in range(3):
                    c.encode(rng.standard_normal(500).astype(np.float32), a)
                saved = a.save()
                b.load(saved)
                self.assertEqual(b.step, a.step)
                for _ in range(3):
                    g = rng.standard_normal(500).astype(np.float32)
                    self.assertEqual(c.encode(g, a), c.encode(g, b))
                self.assertEqual(a.save(), b.save())
                # refusals leave the state as it was
                before = b.save()
                with self.assertRaisesRegex(gcoll.GcollError, "GCOLL_ERR_MISMATCH"):
                    c.state(499).load(saved)
                with self.assertRaisesRegex(gcoll.GcollError, "GCOLL_ERR_MISMATCH"):
                    gcoll.Compressor("topk:density=0.3").state(500).load(saved)
                for bad in (saved[:-1], saved + b"x", b"GCST", b""):
                    with self.assertRaisesRegex(gcoll.GcollError, "GCOLL_ERR_INVALID"):
                        b.load(bad)
                self.assertEqual(b.save(), before)
        with self.assertRaises(TypeError):
            gcoll.Compressor("none").state(4).load("text")

    def test_status_names(self):
        self.assertEqual(gcoll.STATUS_NAMES[-4], "GCOLL_ERR_TIMEOUT")
        self.assertIn("timed out", gcoll.status_string(-4))
        self.assertIn("tcp", gcoll.transports_built())


if __name__ == "__main__":
    unittest.main()
