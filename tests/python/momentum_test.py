"""The DDP hook's momentum correction (spex.torch.register(..., momentum_correction=m)) on a fake
client, against hand-computed values: the hook hands u = m u + g to the daemon, keeps u in
float32 for half buckets, zeroes u where the averaged result is non-zero (momentum factor
masking), starts u over when DDP rebuilds its buckets, saves and restores u with state_dict (also
onto another DDP bucket layout, per parameter), and refuses bad factors and dense compressors
naming the fix."""

import unittest

import torch

import spex.torch
from spex.errors import SpexError, SpexValueError
from spex_test_util import FakeClient, FakeGradBucket


_PARAMS = {}


def grad(index, values, dtype=torch.float32):
    """DDP bucket `index` holding gradient `values`: the same parameter object for the same size
    and type (a new one would look like DDP rebuilding its buckets)."""
    t = torch.tensor(values, dtype=dtype)
    p = _PARAMS.setdefault((len(values), dtype), torch.nn.Parameter(t.clone()))
    return FakeGradBucket(index, [p], buffer=t)


class MomentumCorrectionTest(unittest.TestCase):
    def make(self, m=0.5, results=None, compressor="micro", client_compressor="micro", masking=True):
        client = FakeClient(results, compressor=client_compressor)
        state = spex.torch.SpexHookState(None, client=client, compressor=compressor, momentum_correction=m,
                                         momentum_masking=masking)
        self.addCleanup(state.close)
        return state, client

    def test_hands_over_u_and_masks_it_where_the_result_is_non_zero(self):
        results = [torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 2.0, 0.0])]
        state, client = self.make(0.5, results)
        state(grad(0, [1.0, 2.0, 3.0, 4.0])).wait()
        self.assertEqual(client.handed[0].tolist(), [1.0, 2.0, 3.0, 4.0])  # u1 = g1
        self.assertEqual(state._u[0].tolist(), [0.0, 2.0, 3.0, 4.0])  # masked where result 1 is non-zero
        out = state(grad(0, [10.0, 10.0, 10.0, 10.0])).wait()
        self.assertEqual(client.handed[1].tolist(), [10.0, 11.0, 11.5, 12.0])  # u2 = 0.5 u1 + g2
        self.assertEqual(state._u[0].tolist(), [10.0, 11.0, 0.0, 12.0])
        self.assertEqual(out.tolist(), [0.0, 0.0, 2.0, 0.0])

    def test_without_masking_u_is_kept_and_a_full_selection_is_momentum_sgd(self):
        # momentum_masking=False: u = m u + g goes over whatever the result (here non-zero at
        # element 0 every step), so what is handed over is momentum SGD's buffer (torch.optim.SGD:
        # b = m b + g, first b = g); with every element selected the update is momentum SGD's.
        gs = [[1.0, -2.0, 0.5], [0.25, 4.0, -1.0], [3.0, 0.0, 2.0], [-1.0, 1.0, 1.0]]

        client = FakeClient([torch.tensor([5.0, 0.0, 0.0])] * 4)
        state = spex.torch.SpexHookState(None, client=client, compressor="micro", momentum_correction=0.5,
                                         momentum_masking=False)
        self.addCleanup(state.close)
        buf = torch.zeros(3)
        for i, g in enumerate(gs):
            state(grad(0, g)).wait()
            buf = torch.tensor(g) if i == 0 else buf * 0.5 + torch.tensor(g)
            self.assertEqual(client.handed[i].tolist(), buf.tolist())  # handed u = momentum SGD's buffer
            self.assertEqual(state._u[0].tolist(), buf.tolist())  # not masked by the non-zero result
        saved = state.state_dict()
        self.assertIs(saved["momentum_masking"], False)
        masked, _ = self.make(0.5)
        with self.assertRaises(SpexValueError) as e:
            masked.load_state_dict(saved)
        self.assertIn("momentum_masking=False", str(e.exception))
        again, again_client = self.make(0.5, masking=False)
        again.load_state_dict(saved)
        again(grad(0, [1.0, 1.0, 1.0])).wait()
        self.assertEqual(again_client.handed[0].tolist(), (buf * 0.5 + 1.0).tolist())

    def test_without_it_the_gradient_goes_over_unchanged(self):
        state, client = self.make(None, [torch.zeros(2)] * 2)
        state(grad(0, [1.0, 2.0])).wait()
        state(grad(0, [3.0, 4.0])).wait()
        self.assertEqual(client.handed[1].tolist(), [3.0, 4.0])
        self.assertEqual(state._u, {})

    def test_half_buckets_keep_u_in_float32(self):
        state, client = self.make(0.9)
        g = [1.0, 0.0078125, -3.0]
        want = torch.zeros(3)
        for _ in range(5):  # results all zero: nothing is masked
            state(grad(0, g, torch.bfloat16)).wait()
            want = want * 0.9 + torch.tensor(g)
        self.assertEqual(state._u[0].dtype, torch.float32)
        self.assertTrue(torch.equal(state._u[0], want), f"{state._u[0]} != {want}")
        self.assertEqual(client.handed[-1].dtype, torch.bfloat16)
        self.assertTrue(torch.equal(client.handed[-1], want.to(torch.bfloat16)))

    def test_a_rebuild_starts_u_over(self):
        state, client = self.make(0.5)
        state(grad(0, [1.0, 1.0])).wait()
        state(grad(0, [1.0, 1.0, 1.0])).wait()  # bucket 0 changed: DDP rebuilt its buckets
        self.assertEqual(client.handed[1].tolist(), [1.0, 1.0, 1.0])

    def test_state_dict_restores_u(self):
        state, client = self.make(0.5)
        state(grad(0, [2.0, 4.0])).wait()
        saved = state.state_dict()
        self.assertEqual(saved["momentum_correction"], 0.5)
        self.assertEqual(saved["buckets"][0]["momentum"][0].tolist(), [2.0, 4.0])
        state(grad(0, [1.0, 1.0])).wait()
        fresh, fresh_client = self.make(0.5)
        fresh.load_state_dict(saved)
        fresh(grad(0, [1.0, 1.0])).wait()
        self.assertEqual(fresh_client.handed[0].tolist(), client.handed[1].tolist())  # [2, 3]
        self.assertEqual(fresh_client.handed[0].tolist(), [2.0, 3.0])
        other, _ = self.make(0.9)
        with self.assertRaises(SpexValueError) as e:
            other.load_state_dict(saved)
        self.assertIn("momentum_correction=0.5", str(e.exception))
        off, _ = self.make(None)
        with self.assertRaises(SpexValueError):
            off.load_state_dict(saved)

    def test_u_follows_its_parameters_onto_another_ddp_layout(self):
        # A resumed job (docs/checkpoint.md): u is saved per saved bucket, in that bucket's parameter
        # order, and DDP's first bucket after the restart holds the parameters in another order.
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))

        class Ddp:
            process_group = None

            def parameters(self):
                return iter([a, b])

        def make(results=None):
            client = FakeClient(results)
            state = spex.torch.SpexHookState(Ddp(), client=client, compressor="micro", momentum_correction=0.5)
            self.addCleanup(state.close)
            return state, client

        state, _ = make()
        state(FakeGradBucket(0, [b, a], buffer=torch.tensor([3.0, 4.0, 5.0, 1.0, 2.0]))).wait()
        saved = state.state_dict()
        self.assertEqual(saved["buckets"][0]["momentum"][0].tolist(), [3.0, 4.0, 5.0, 1.0, 2.0])
        fresh, client = make([torch.tensor([0.0, 7.0, 0.0, 9.0, 0.0])])
        fresh.load_state_dict(saved)
        out = fresh(FakeGradBucket(0, [a, b], buffer=torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0]))).wait()
        # u = 0.5 u + g in the saved order (b, a): [0.5*3+30, 0.5*4+40, 0.5*5+50, 0.5*1+10, 0.5*2+20]
        self.assertEqual(client.handed[0].tolist(), [31.5, 42.0, 52.5, 10.5, 21.0])
        self.assertEqual(fresh._u[0].tolist(), [31.5, 0.0, 52.5, 0.0, 21.0])  # masked where the result is non-zero
        self.assertEqual(out.tolist(), [9.0, 0.0, 0.0, 7.0, 0.0])  # back in DDP's order (a, b)

    def test_bad_factors_and_dense_are_refused_naming_the_fix(self):
        for bad in (0.0, 1.0, -0.5, 1.5, "0.9"):
            with self.assertRaises(SpexValueError) as e:
                spex.torch.SpexHookState(None, client=FakeClient(), momentum_correction=bad)
            self.assertIn("momentum_correction must be a momentum factor in (0, 1)", str(e.exception))
        with self.assertRaises(SpexValueError) as e:
            spex.torch.SpexHookState(None, client=FakeClient(), compressor="dense", momentum_correction=0.9)
        self.assertIn("needs a sparse compressor", str(e.exception))
        state, _ = self.make(0.9, compressor=None, client_compressor="dense")  # the daemon's default: dense
        with self.assertRaises(SpexValueError) as e:
            state(grad(0, [1.0]))
        self.assertIn("pass compressor=", str(e.exception))


if __name__ == "__main__":
    unittest.main()
