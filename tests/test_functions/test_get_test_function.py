r"""Name look-up of test functions: ours and BoTorch's."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from botorch.test_functions import Branin, Hartmann, Levy, StyblinskiTang
from botorch.test_functions.synthetic import SyntheticTestFunction

from botorch_fed.test_functions import (
    CEC2005F3,
    CEC2005F17,
    CoKGRosenbrock,
    CoKGSinCosBowl,
    get_test_function,
    list_test_functions,
)
from tests.helpers import cec_numpy_reference as ref

needs_cec = pytest.mark.skipif(not ref.HAS_OPFUNU, reason="needs botorch-fed[cec]")


@needs_cec
@pytest.mark.parametrize("name", ["cec2005-f3", "CEC2005_F3", "Cec2005F3", " cec-2005-f3"])
def test_cec_names(name: str) -> None:
    fn = get_test_function(name)
    assert type(fn) is CEC2005F3 and fn.dim == 10
    assert get_test_function(name, dim=30).dim == 30


@needs_cec
def test_cec_options_are_passed() -> None:
    fn = get_test_function("cec2005-f17", dim=10, noise_std=0.5, negate=True, seed=3)
    assert type(fn) is CEC2005F17 and fn.negate and fn.noise_std == 0.5
    again = get_test_function("cec2005-f17", dim=10, noise_std=0.5, negate=True, seed=3)
    X = torch.zeros(4, 10, dtype=torch.float64)
    torch.testing.assert_close(fn(X), again(X))
    quiet = get_test_function("cec2005-f17", dim=10, fitness_noise=0.0)
    torch.testing.assert_close(quiet(X), quiet.evaluate_true(X))
    with pytest.raises(ValueError, match="dim=7"):
        get_test_function("cec2005-f1", dim=7)


def test_cokg_names() -> None:
    assert type(get_test_function("cokg-f1")) is CoKGSinCosBowl
    assert type(get_test_function("CoKG_F2", dim=2)) is CoKGRosenbrock
    assert type(get_test_function("cokg-rosenbrock")) is CoKGRosenbrock
    with pytest.raises(ValueError, match="dim=3"):
        get_test_function("cokg-f1", dim=3)


def test_botorch_functions_by_name() -> None:
    h = get_test_function("Hartmann", dim=6)
    assert isinstance(h, Hartmann) and h.dim == 6
    # Hartmann-6's published minimum -3.32237 at its published minimiser
    assert h(h.optimizers, noise=False).item() == pytest.approx(-3.32237, abs=1e-4)
    assert isinstance(get_test_function("branin"), Branin)
    assert get_test_function("styblinski_tang", dim=3).dim == 3
    assert isinstance(get_test_function("STYBLINSKI-TANG"), StyblinskiTang)
    levy = get_test_function("levy", dim=4, negate=True)
    assert isinstance(levy, Levy) and levy.dim == 4 and levy.negate
    assert levy(torch.ones(4, dtype=torch.float64)).item() == pytest.approx(0.0, abs=1e-12)
    assert get_test_function("rosenbrock", dim=5).dim == 5  # BoTorch's, not Co-KG's


def test_bad_dimensions_name_dim() -> None:
    with pytest.raises(ValueError, match=r"dim in \(3, 4, 6\); got dim=5"):
        get_test_function("hartmann", dim=5)
    with pytest.raises(ValueError, match="fixed dimension 2; got dim=3"):
        get_test_function("branin", dim=3)
    assert get_test_function("branin", dim=2).dim == 2


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(ValueError, match="Unknown test function name 'hartman'") as info:
        get_test_function("hartman")
    assert "hartmann" in str(info.value)
    with pytest.raises(ValueError, match="cec2005-f2"):
        get_test_function("cec2005-f21")
    with pytest.raises(ValueError, match="list_test_functions"):
        get_test_function("no-such-function-at-all")


def test_list_test_functions_resolves() -> None:
    names = list_test_functions()
    assert names[:20] == [f"cec2005-f{i}" for i in range(1, 21)]
    assert {"cokg-f1", "cokg-f2", "hartmann", "levy", "ackley", "branin"} <= set(names)
    assert {"rosenbrock", "styblinskitang"} <= set(names)
    assert len(names) == len(set(names))
    for name in names:
        if name.startswith("cec2005") and not ref.HAS_OPFUNU:
            continue
        try:
            fn = get_test_function(name)
        except ValueError as err:  # functions without a default dimension
            assert "needs `dim`" in str(err), name
            fn = get_test_function(name, dim=4)
        assert isinstance(fn, SyntheticTestFunction), name


def test_seeded_botorch_function() -> None:
    X = torch.rand(5, 6, dtype=torch.float64)
    state = torch.get_rng_state()
    a = get_test_function("hartmann", dim=6, noise_std=0.1, seed=1)
    b = get_test_function("hartmann", dim=6, noise_std=0.1, seed=1)
    c = get_test_function("hartmann", dim=6, noise_std=0.1, seed=2)
    ya = a(X)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(a, Hartmann)
    torch.testing.assert_close(ya, b(X), rtol=0, atol=0)
    assert not torch.allclose(ya, c(X))
    torch.testing.assert_close(a(X, noise=False), Hartmann(dim=6)(X, noise=False))
    assert a.negate is False and get_test_function("hartmann", seed=1, negate=True).negate
    clone = pickle.loads(pickle.dumps(b))
    torch.testing.assert_close(clone(X), b(X))
    # BoTorch's input validation is kept
    with pytest.raises(ValueError):
        a(torch.rand(5, 3, dtype=torch.float64))


def test_missing_extra_gives_clear_import_error() -> None:
    code = textwrap.dedent(
        """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("opfunu", "optproblems"):
                    raise ModuleNotFoundError(name)
                return None
        sys.meta_path.insert(0, Block())
        import botorch_fed.test_functions as tf
        tf.get_test_function("cokg-f1")
        try:
            tf.get_test_function("cec2005-f1", dim=10)
        except ImportError as err:
            print("IMPORT-ERROR:", err)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORT-ERROR:" in out.stdout
    assert "pip install botorch-fed[cec]" in out.stdout
