r"""botorch_fed.secure without TenSEAL (the optional ``secure`` extra).

TenSEAL is imported only when a ``ckks`` backend is created; everything else (the
package, ``plaintext``, ``masking``, FBO-FedGP with ``--aggregator masking``) must
work without it, and asking for ``ckks`` must raise
:class:`~botorch_fed.secure.errors.BackendUnavailableError` saying why and naming
``masking``. TenSEAL is installed in the test environment, so each check runs in a
fresh interpreter whose import system refuses ``tenseal`` (a meta-path finder that
raises ``ModuleNotFoundError``, exactly what a missing package raises).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Prepended to every child script: makes ``import tenseal`` fail as if not installed.
_BLOCK_TENSEAL = textwrap.dedent(
    """
    import sys

    class _NoTenSEAL:
        def find_spec(self, name, path=None, target=None):
            if name == "tenseal" or name.startswith("tenseal."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoTenSEAL())
    """
)

_LIBRARY_CHECKS = """
import json
import numpy as np
import botorch_fed.secure as secure
from botorch_fed.secure import (
    BackendUnavailableError, CKKSBackend, ConfigurationError, aggregate, available_backends,
    backend_unavailable_reason, get_backend, make_aggregator,
)

out = {"tenseal_imported_by_package": "tenseal" in sys.modules}
out["available"] = list(available_backends())
out["ckks_reason"] = backend_unavailable_reason("ckks")
out["masking_reason"] = backend_unavailable_reason("masking")
arrays = [np.arange(5.0) * (i + 1) - 2.5 * i for i in range(4)]
out["masking_sum"] = make_aggregator("masking", seed=0)(arrays).tolist()
out["masking_sum_narrow"] = make_aggregator("masking", wide=False, seed=1)(arrays).tolist()
inputs = {i: a for i, a in enumerate(arrays)}
out["masking_driver_sum"] = aggregate(get_backend("masking"), inputs, seed=2).tolist()
out["plaintext_sum"] = make_aggregator("plaintext", seed=0)(arrays).tolist()
out["exact_sum"] = np.sum(arrays, axis=0).tolist()
out["errors"] = {}
for what, call in [
    ("get_backend", lambda: get_backend("ckks")),
    ("get_backend_with_options", lambda: get_backend("ckks", poly_modulus_degree=16384)),
    ("make_aggregator", lambda: make_aggregator("ckks")),
    ("CKKSBackend", lambda: CKKSBackend()),
]:
    try:
        call()
    except BackendUnavailableError as exc:
        out["errors"][what] = {
            "message": str(exc),
            "is_configuration_error": isinstance(exc, ConfigurationError),
            "is_value_error": isinstance(exc, ValueError),
            "is_import_error": isinstance(exc, ImportError),
        }
    except Exception as exc:  # the wrong error: report it
        out["errors"][what] = {"message": f"{type(exc).__name__}: {exc}"}
    else:
        out["errors"][what] = None
print(json.dumps(out))
"""


def _run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_TENSEAL + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_cli(*argv: str) -> subprocess.CompletedProcess:
    return _run("from botorch_fed.cli import main\nsys.exit(main(sys.argv[1:]))\n", *argv)


@pytest.fixture(scope="module")
def library() -> dict:
    proc = _run(_LIBRARY_CHECKS)
    assert proc.returncode == 0, f"child failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_blocker_really_blocks_tenseal() -> None:
    proc = _run("import tenseal\n")
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'tenseal'" in proc.stderr


def test_package_imports_without_tenseal(library: dict) -> None:
    assert library["tenseal_imported_by_package"] is False


def test_available_backends_tell_the_truth(library: dict) -> None:
    assert library["available"] == ["plaintext", "masking"]
    assert library["masking_reason"] is None
    assert "TenSEAL is not installed" in library["ckks_reason"]


def test_masking_and_plaintext_sum_without_tenseal(library: dict) -> None:
    exact = library["exact_sum"]
    for key in ("masking_sum", "masking_sum_narrow", "masking_driver_sum", "plaintext_sum"):
        assert library[key] == pytest.approx(exact, rel=0, abs=1e-9), key


@pytest.mark.parametrize(
    "what", ["get_backend", "get_backend_with_options", "make_aggregator", "CKKSBackend"]
)
def test_ckks_raises_a_clear_error(library: dict, what: str) -> None:
    err = library["errors"][what]
    assert err is not None, f"{what}('ckks') did not raise without TenSEAL"
    message = err["message"]
    assert "TenSEAL is not installed" in message
    assert "botorch-fed[secure]" in message  # how to get it
    assert "'masking'" in message  # what to use instead
    assert err["is_configuration_error"] and err["is_value_error"] and err["is_import_error"]


def test_cli_reports_missing_tenseal_without_traceback() -> None:
    proc = _run_cli(
        "run", "fbo-fedgp", "--problem", "hartmann", "--dim", "3", "--clients", "3",
        "--rounds", "1", "--aggregator", "ckks",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())  # undo the console's line wrapping
    assert "error:" in text and "error:" not in proc.stdout  # on standard error
    assert "TenSEAL is not installed" in text
    assert "botorch-fed[secure]" in text  # not eaten as console markup
    assert "--aggregator masking" in text


def test_cli_fbo_fedgp_with_masking_runs_without_tenseal() -> None:
    proc = _run_cli(
        "run", "fbo-fedgp", "--problem", "hartmann", "--dim", "3", "--clients", "3",
        "--init", "3", "--rounds", "2", "--aggregator", "masking", "--seed", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert "best value (federation)" in proc.stdout
    assert "secure_aggregation" in proc.stdout
