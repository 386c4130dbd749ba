"""Invalid inputs, options, parameters and too few clients raise documented errors."""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import (
    HE_STANDARD_MAX_LOGQ,
    ConfigurationError,
    HeadroomError,
    InputError,
    SecureAggregationError,
    TooFewClientsError,
    aggregate,
    available_backends,
    backend_options,
    get_backend,
)
from botorch_fed.secure import fixed_point as fp
from botorch_fed.secure.ckks_keys import CKKSParameters, ServerKeyMaterial
from tests.helpers.secure_roles import make_roles, plain_sum, random_inputs
from tests.helpers.secure_sum_bounds import assert_sum_close

# The round in which each backend reads the input vector.
INPUT_ROUND = {"plaintext": 0, "masking": 2, "ckks": 0}
NAMES = list(INPUT_ROUND)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (np.array([0.5, np.nan, 0.1]), "NaN/inf"),
        (np.array([0.5, 0.2, np.inf]), "NaN/inf"),
        (np.array([-np.inf, 0.2, 0.1]), "NaN/inf"),
        (np.array([0.5, 0.2]), "length 2"),
        (np.ones((3, 1)), "1-D"),
        (np.array([1j, 0, 0]), "real"),
        (None, "None"),
    ],
)
def test_bad_input_vector(name: str, bad, match: str) -> None:
    inputs = random_inputs(4, 3, seed=30)
    inputs[2] = bad
    with pytest.raises(InputError, match=match) as info:
        aggregate(get_backend(name), inputs)
    assert info.value.client_id == 2 and info.value.round == INPUT_ROUND[name]
    assert "client 2" in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_too_few_clients(name: str) -> None:
    inputs = random_inputs(2, 3, seed=31)
    with pytest.raises(TooFewClientsError, match="min_clients=3"):
        aggregate(get_backend(name), inputs)
    # Explicit override: two clients allowed, and the sum is still right.
    backend = get_backend(name, min_clients=2, allow_two_clients=True)
    total = aggregate(backend, inputs)
    if name == "ckks":  # encryption noise, not rounding (test_correctness.CKKS_NOISE)
        assert np.max(np.abs(total - plain_sum(inputs))) <= 1e-8
    else:
        assert_sum_close(total, plain_sum(inputs), name, inputs)


@pytest.mark.parametrize("name", NAMES)
def test_min_clients_rules(name: str) -> None:
    with pytest.raises(ConfigurationError, match="allow_two_clients"):
        get_backend(name, min_clients=2)
    with pytest.raises(ConfigurationError, match="min_clients"):
        get_backend(name, min_clients=1, allow_two_clients=True)
    with pytest.raises(ConfigurationError, match="min_clients"):
        get_backend(name, min_clients=2.5)
    assert get_backend(name, min_clients=5).min_clients == 5


@pytest.mark.parametrize("name", NAMES)
def test_client_refuses_session_below_its_minimum(name: str) -> None:
    lax = get_backend(name, min_clients=2, allow_two_clients=True)
    strict = get_backend(name)
    setup = lax.setup([0, 1])
    server = lax.server(setup.server_material)
    client = strict.client(0, setup.for_client(0))
    msgs = server.start([0, 1], 3)
    with pytest.raises(TooFewClientsError, match="refusing") as info:
        client.step(msgs[0], np.zeros(3))
    assert info.value.client_id == 0


def test_masking_headroom() -> None:
    backend = get_backend("masking")
    bound = backend.max_abs_supported(3)
    assert bound == pytest.approx(2.0**23 / 3, rel=1e-6)
    ok = {i: np.full(4, 0.99 * bound) for i in range(3)}
    total = aggregate(backend, ok)
    assert_sum_close(total, plain_sum(ok), "masking", ok)
    bad = {i: np.full(4, 1.01 * bound) for i in range(3)}
    with pytest.raises(HeadroomError, match="exceeds") as info:
        aggregate(backend, bad)
    assert info.value.round == 2  # before the masked input is sent
    # Without the check the fixed-point sum would silently wrap around.
    raw = [np.rint(x * 2.0**40).astype(np.int64).view(np.uint64) for x in bad.values()]
    wrapped = fp.decode(sum(raw))
    assert np.all(wrapped < 0)


def test_ckks_headroom() -> None:
    backend = get_backend("ckks")
    bound = backend.max_abs_supported(3)
    # Capped by CKKS's magnitude-relative rounding error (2^30 / M), far below the
    # wrap-around bound (~2^65 / M); see tests/secure/test_ckks_magnitudes.py.
    assert bound == 2.0**30 / 3
    assert bound < backend.params.wrap_bound(3) / 1e9
    bad = random_inputs(3, 5, seed=32)
    bad[1][0] = 1.5 * bound
    with pytest.raises(HeadroomError) as info:
        aggregate(backend, bad)
    assert info.value.client_id == 1 and info.value.round == 0


def test_fixed_point_encode_rejects_overflow() -> None:
    with pytest.raises(HeadroomError):
        fp.encode(np.array([2.0**23]), 1)
    x = np.array([-1.5, 0.0, 2.0**-40, 3.25])
    assert np.array_equal(fp.decode(fp.encode(x, 4)), x)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"poly_modulus_degree": 1000}, "poly_modulus_degree"),
        ({"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": (60, 60, 60, 60)}, "128-bit"),
        ({"poly_modulus_degree": 4096, "coeff_mod_bit_sizes": (60, 60)}, "128-bit"),
        (
            {"poly_modulus_degree": 1024, "coeff_mod_bit_sizes": (14, 13), "scale_bits": 20},
            "headroom",
        ),
        ({"coeff_mod_bit_sizes": (60,)}, "coeff_mod_bit_sizes"),
        ({"coeff_mod_bit_sizes": (60, 61, 60)}, "coeff_mod_bit_sizes"),
        ({"coeff_mod_bit_sizes": "60,60"}, "coeff_mod_bit_sizes"),
        ({"scale_bits": 61}, "scale_bits"),
        ({"scale_bits": 19}, "scale_bits"),
        ({"coeff_mod_bit_sizes": (40, 40), "scale_bits": 30}, "headroom"),
        ({"encryption": "rsa"}, "encryption"),
        ({"release": "everyone"}, "release"),
        ({"release_noise": -1.0}, "release_noise"),
        ({"release_noise": float("nan")}, "release_noise"),
        ({"n_threads": 0}, "n_threads"),
    ],
)
def test_invalid_ckks_parameters(options: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        get_backend("ckks", **options)


def _split_bits(total: int) -> tuple[int, ...]:
    pieces = max(2, -(-total // 60))
    return tuple(total // pieces + (i < total % pieces) for i in range(pieces))


def test_he_standard_table_is_enforced_for_every_degree() -> None:
    for n, max_logq in HE_STANDARD_MAX_LOGQ.items():
        bits = _split_bits(max_logq + 1)
        assert sum(bits) == max_logq + 1 and max(bits) <= 60
        with pytest.raises(ConfigurationError, match="128-bit"):
            CKKSParameters(n, bits, 20)
        if n >= 4096:  # exactly at the bound is accepted
            assert sum(CKKSParameters(n, _split_bits(max_logq), 20).coeff_mod_bit_sizes) == max_logq


def test_registry_errors() -> None:
    assert set(available_backends()) == {"plaintext", "ckks", "masking"}
    with pytest.raises(ConfigurationError, match="allowed: \\['plaintext', 'ckks', 'masking'\\]"):
        get_backend("paillier")
    with pytest.raises(ConfigurationError, match="'poly_degree'.*allowed"):
        get_backend("ckks", poly_degree=4096)
    with pytest.raises(ConfigurationError, match="'threshold'"):
        get_backend("plaintext", threshold=3)
    assert "threshold" in backend_options("masking")
    assert issubclass(ConfigurationError, SecureAggregationError)
    assert issubclass(SecureAggregationError, ValueError)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"threshold": 1}, "threshold"),
        ({"threshold": 2.5}, "threshold"),
        ({"fraction_bits": 60}, "fraction_bits"),
        ({"fraction_bits": 4}, "fraction_bits"),
    ],
)
def test_invalid_masking_options(options: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        get_backend("masking", **options)


def test_masking_threshold_must_be_a_majority() -> None:
    inputs = random_inputs(5, 3, seed=33)
    with pytest.raises(ConfigurationError, match="threshold"):
        aggregate(get_backend("masking", threshold=2), inputs)
    with pytest.raises(ConfigurationError, match="threshold"):
        aggregate(get_backend("masking", threshold=6), inputs)
    total = aggregate(get_backend("masking", threshold=5), inputs)
    assert_sum_close(total, plain_sum(inputs), "masking", inputs)


def test_key_material_checks() -> None:
    ckks = get_backend("ckks")
    setup = ckks.setup([0, 1, 2])
    with pytest.raises(ConfigurationError, match="server key material"):
        ckks.server(setup.for_client(0))  # a client's (secret) material
    # Server material that smuggles a secret key is refused.
    public = ServerKeyMaterial.from_bytes(setup.server_material)
    from botorch_fed.secure.ckks_keys import ClientKeyMaterial

    secret_ctx = ClientKeyMaterial.from_bytes(setup.for_client(0)).context
    smuggled = ServerKeyMaterial(
        public.params, public.encryption, public.key_id, public.decryptors, secret_ctx
    ).to_bytes()
    with pytest.raises(ConfigurationError, match="secret key"):
        ckks.server(smuggled)
    other = get_backend(
        "ckks", poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 49), scale_bits=40
    )
    with pytest.raises(ConfigurationError, match="made for"):
        other.server(setup.server_material)
    with pytest.raises(ConfigurationError, match="corrupted"):
        ckks.client(0, setup.for_client(0)[:-5])
    with pytest.raises(ConfigurationError):
        get_backend("masking").server(b"x")


def test_driver_input_checks() -> None:
    with pytest.raises(InputError, match="non-empty"):
        aggregate(get_backend("masking"), {})
    with pytest.raises(InputError, match="dropped client 7"):
        aggregate(get_backend("masking"), random_inputs(3, 2), dropped=[7])
    with pytest.raises(InputError, match="client ids"):
        aggregate(get_backend("masking"), {"a": np.zeros(2), 1: np.zeros(2), 2: np.zeros(2)})
    with pytest.raises(InputError, match="seed"):
        aggregate(get_backend("masking"), random_inputs(3, 2), seed=-1)
    server, _ = make_roles(get_backend("masking"), [0, 1, 2])
    with pytest.raises(InputError, match="length"):
        server.start([0, 1, 2], 0)
    with pytest.raises(InputError, match="duplicate"):
        server.start([0, 1, 1], 3)
