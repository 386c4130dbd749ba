r"""Review of 68b843b / 3f3cbae (AES-CTR words, one ``(2, ..., d)`` buffer for x +- h z):
the defects it found (an ``h`` that requires grad, forward-mode AD, f's inputs sharing
one storage, the AES key drawn on the default device), each a test that failed then."""

from __future__ import annotations

import pickle

import pytest
import torch

from botorch_fed.zeroth_order import l1_gradient, l2_gradient, sample_l1_sphere, sampling


def _f(Z):
    return (Z**2).sum(-1)


def test_l2_gradient_with_h_that_requires_grad():
    x = torch.rand(6, 3, dtype=torch.float64)
    h = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    g = l2_gradient(_f, x, h, torch.Generator().manual_seed(0))
    ref = l2_gradient(_f, x, 0.1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(g.detach(), ref)
    assert g.requires_grad


def test_l2_gradient_under_forward_mode_ad():
    x = torch.rand(6, 3, dtype=torch.float64)

    def est(x):
        return l2_gradient(_f, x, 0.1, torch.Generator().manual_seed(0))

    g, tangent = torch.func.jvp(est, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(g, est(x))
    assert tangent.shape == x.shape


@pytest.mark.parametrize("name", ["l1", "l2"])
def test_objective_input_owns_its_storage(name):
    seen = []

    def f(Z):
        # what an objective that serialises its query points (to a worker, a log, a
        # checkpoint) sends: the whole storage of the tensor it was given
        seen.append(pickle.loads(pickle.dumps(Z)).untyped_storage().nbytes())
        return Z.sum(-1)

    x = torch.rand(8, 16, dtype=torch.float64)
    (l1_gradient if name == "l1" else l2_gradient)(f, x, 0.1, torch.Generator().manual_seed(0))
    assert seen == [x.numel() * x.element_size()] * 2


def test_words_key_is_drawn_on_the_cpu_whatever_the_default_device():
    n = sampling.WORDS_MIN_NUMEL
    torch.manual_seed(7)
    expected = sample_l1_sphere(n, d=1, dtype=torch.float64)
    torch.manual_seed(7)
    with torch.device("meta"):
        z = sample_l1_sphere(n, d=1, device="cpu", dtype=torch.float64)
    assert z.device.type == "cpu"
    assert torch.equal(z, expected)
