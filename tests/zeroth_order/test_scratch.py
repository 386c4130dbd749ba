r"""The l1 estimator's per-thread scratch buffer (``estimators._scratch``): reused when the
objective keeps nothing, never written again while anything the objective left behind
still refers to it, and separate per thread."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from botorch_fed.zeroth_order import estimators, l1_gradient, release_scratch
from tests.helpers.tolerances import assert_close

DTYPES = [torch.float32, torch.float64]


pytestmark = pytest.mark.usefixtures("scratch_words_path")


def _linear(d: int, dtype: torch.dtype):
    a = torch.linspace(-1.0, 1.0, d, dtype=dtype)
    return lambda Z: Z @ a


@pytest.mark.skipif(
    estimators._holders(torch.zeros(1)) is None,
    reason="this torch does not expose the reference counts: the buffer is never reused",
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_buffer_is_reused_when_f_keeps_nothing(dtype):
    n, d = 6, 5
    ptrs = []
    lin = _linear(d, dtype)

    def f(Z):
        ptrs.append(Z.data_ptr())  # an int: refers to nothing
        return lin(Z)

    x = torch.rand(n, d, dtype=dtype)
    g1, z1, yp1, ym1 = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(0), return_values=True)
    g2 = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1))
    # both sides and both calls in one buffer, kept by this thread afterwards
    assert len(set(ptrs)) == 1
    assert estimators._scratch.buffer is not None
    assert estimators._scratch.buffer.data_ptr() == ptrs[0]
    # and the values are those of x +- h z (the buffer's reuse changes no result): the
    # points differ by three roundings on each side (eps/2 of |x_j| + h |z_j|), then each
    # side sums d products (d eps of sum_j |a_j| (|x_j| + h |z_j|), |a_j| <= 1)
    scale = float((x.abs() + 0.1 * z1.abs()).sum(-1).max())
    assert_close(yp1, lin(x + 0.1 * z1), dtype=dtype, factor=2 * d + 3, scale=scale)
    assert_close(ym1, lin(x - 0.1 * z1), dtype=dtype, factor=2 * d + 3, scale=scale)
    release_scratch()
    assert estimators._scratch.buffer is None
    assert torch.equal(g2, l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1)))
    assert not torch.equal(g1, g2)


def _keep_tensor(Z, kept):
    kept.append(Z)


def _keep_view(Z, kept):
    kept.append(Z[1:])


def _keep_numpy(Z, kept):
    kept.append(Z.numpy())


def _keep_storage(Z, kept):
    kept.append(Z.untyped_storage())


def _keep_weakref(Z, kept):
    kept.append(weakref.ref(Z))


def _keep_dlpack(Z, kept):
    kept.append(torch.utils.dlpack.to_dlpack(Z))


def _keep_storage_weakref(Z, kept):
    kept.append(weakref.ref(Z.untyped_storage()))


def _keep_view_storage_weakref(Z, kept):
    kept.append(weakref.ref(Z[1:].untyped_storage()))


def _keep_weak_id_dict(Z, kept):
    # a memo keyed weakly by storage identity
    memo = torch.utils.weak.WeakIdKeyDictionary()
    memo[Z.untyped_storage()] = True
    kept.append(lambda memo=memo: next(iter(memo.keys()), None))


WEAK = (_keep_weakref, _keep_storage_weakref, _keep_view_storage_weakref, _keep_weak_id_dict)


def _call_twice(keep, x) -> tuple[list, list]:
    r"""Two estimates with an ``f`` that copies its input (``seen``) and lets ``keep``
    keep it (``kept``); the second call would reuse a kept buffer."""
    seen, kept = [], []

    def f(Z):
        seen.append(Z.clone())
        keep(Z, kept)
        return Z.sum(-1)

    for seed in (0, 1):
        l1_gradient(f, x, 0.1, torch.Generator().manual_seed(seed))
    return seen, kept


def _keep_in_thread(Z, kept):
    # a worker that reads its input after f has returned
    event = threading.Event()
    thread = threading.Thread(target=lambda T=Z: (event.wait(), kept.append(T.clone())))
    thread.start()
    kept.append((event, thread))


def _read(kept_item, shape):
    r"""The values that a kept object refers to, as a tensor of ``shape``."""
    if isinstance(kept_item, torch.Tensor):
        return kept_item
    if isinstance(kept_item, np.ndarray):
        return torch.from_numpy(kept_item)
    if isinstance(kept_item, weakref.ref) or callable(kept_item):
        kept_item = kept_item()  # a weak reference: None once nothing else holds it
        if not isinstance(kept_item, torch.UntypedStorage):
            return kept_item
    if isinstance(kept_item, torch.UntypedStorage):
        dtype = torch.float32 if kept_item.nbytes() == 4 * shape.numel() else torch.float64
        return torch.tensor([], dtype=dtype).set_(kept_item).reshape(shape)
    return torch.utils.dlpack.from_dlpack(kept_item)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "keep",
    [_keep_tensor, _keep_view, _keep_numpy, _keep_storage, _keep_dlpack, *WEAK],
)
def test_what_f_keeps_is_never_written(dtype, keep):
    seen, kept = _call_twice(keep, torch.rand(4, 3, dtype=dtype))
    assert len(kept) == len(seen) == 4
    for item, values in zip(kept, seen, strict=True):
        got = _read(item, values.shape)
        if got is None:  # a weak reference to an input that nothing kept alive
            assert keep in WEAK
            continue
        expected = values[1:] if keep is _keep_view else values
        assert torch.equal(got, expected)


def test_what_a_thread_reads_after_f_returned_is_unchanged():
    seen, kept = _call_twice(_keep_in_thread, torch.rand(4, 3, dtype=torch.float64))
    handles = [k for k in kept if isinstance(k, tuple)]
    for event, thread in handles:
        event.set()
        thread.join()
    read = [k for k in kept if isinstance(k, torch.Tensor)]
    assert len(read) == 4
    # the threads ran in any order: compare as sets of rows
    assert sorted(map(tuple, torch.cat(read).tolist())) == sorted(
        map(tuple, torch.cat(seen).tolist())
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_that_are_views_of_the_input(dtype):
    # f returns a view of its input: y+ must survive the write of x - h z
    d = 3
    x = torch.rand(5, d, dtype=dtype)
    g, z, yp, ym = l1_gradient(
        lambda Z: Z[..., 0], x, 0.1, torch.Generator().manual_seed(0), return_values=True
    )
    # x +- h z: three roundings on each side (library: h / norm, lap * that, x +; here:
    # lap / norm, 0.1 *, x +), each at most eps/2 of |x| + h |z|
    scale = float(x[:, 0].abs().max()) + 0.1 * float(z[:, 0].abs().max())
    assert_close(yp, x[:, 0] + 0.1 * z[:, 0], dtype=dtype, factor=3, scale=scale)
    assert_close(ym, x[:, 0] - 0.1 * z[:, 0], dtype=dtype, factor=3, scale=scale)
    # g = d / 2h (y+ - y-) sign z from the same y+, y-: three roundings on each side (d / 2h,
    # the difference, the product) and d / 0.2 rounded to dtype, eps/2 each of |g| <= d
    expected = d / 0.2 * (yp - ym).unsqueeze(-1) * torch.where(z >= 0, 1.0, -1.0).to(dtype)
    assert_close(g, expected, dtype=dtype, factor=4, scale=d)


def test_input_of_an_objective_that_raised_is_never_written():
    x = torch.rand(4, 3)
    seen = []

    def bad(Z):
        seen.append(Z.clone())
        raise RuntimeError("objective failed")

    with pytest.raises(RuntimeError, match="objective failed") as info:
        l1_gradient(bad, x, 0.1, torch.Generator().manual_seed(0))
    # the traceback still holds the input f was given
    frame_input = next(e.frame.f_locals["Z"] for e in info.traceback if "Z" in e.frame.f_locals)
    l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(1))
    assert torch.equal(frame_input, seen[0])


def test_threads_have_their_own_buffer():
    n, d = 64, 32
    x = torch.rand(n, d)
    lin = _linear(d, torch.float32)
    expected = [l1_gradient(lin, x, 0.1, torch.Generator().manual_seed(s)) for s in range(8)]
    results, barrier = {}, threading.Barrier(4)

    def work(k):
        barrier.wait()
        for rep in range(20):
            s = (k + rep) % 8
            results[(k, rep)] = (s, l1_gradient(lin, x, 0.1, torch.Generator().manual_seed(s)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80
    assert all(torch.equal(g, expected[s]) for s, g in results.values())


def test_large_batches_are_not_kept(monkeypatch):
    monkeypatch.setattr(estimators, "SCRATCH_MAX_BYTES", 4 * 10 * 3 - 1)
    l1_gradient(lambda Z: Z.sum(-1), torch.rand(10, 3), 0.1)
    assert estimators._scratch.buffer is None
    monkeypatch.setattr(estimators, "SCRATCH_MAX_BYTES", 4 * 10 * 3)
    l1_gradient(lambda Z: Z.sum(-1), torch.rand(10, 3), 0.1)
    assert estimators._scratch.buffer is not None


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_broadcast_x_is_refused(bad):
    # every worker at one x_t (a stride-0 view): the check looks at the stored entries
    base = torch.zeros(1, 3)
    base[0, 2] = bad
    for x in (base.expand(1000, 3), base.unsqueeze(0).expand(4, 5, 3)):
        with pytest.raises(ValueError, match="`x`.*must be finite"):
            l1_gradient(lambda Z: Z.sum(-1), x, 0.1)
    column = torch.tensor([[0.0], [bad]]).expand(2, 4)  # broadcast along d
    with pytest.raises(ValueError, match="`x`.*must be finite"):
        l1_gradient(lambda Z: Z.sum(-1), column, 0.1)


def test_shared_memory_input_is_left_to_f():
    # f moved its input into shared memory (to hand it to another process, which this
    # process cannot see holding it): that memory is never written again
    ptrs = []

    def f(Z):
        Z.share_memory_()
        ptrs.append(Z.data_ptr())
        return Z.sum(-1)

    l1_gradient(f, torch.rand(4, 3), 0.1)
    assert len(set(ptrs)) == 2
    assert estimators._scratch.buffer is None


class _Recording(torch.Tensor):
    r"""A tensor subclass whose ``__torch_function__`` keeps every ``addcmul`` output and
    its value at the time (a reference that exists before the estimator counts any)."""

    log: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.addcmul:
            cls.log.append((out, out.clone()))
        return out


def test_outputs_kept_by_a_subclass_are_never_written():
    _Recording.log = []
    x = torch.rand(4, 3).as_subclass(_Recording)
    for seed in (0, 1):
        l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(seed))
    assert len(_Recording.log) == 4
    assert all(torch.equal(out, value) for out, value in _Recording.log)


# What anything still refers to when ``f`` returns is left to it and never written again,
# also where ``_holders``' counts (taken just before and just after ``f``) do not see the
# reference: one taken before the "before" count, or a storage swapped in by ``f``.
class _RecordOutputs(TorchDispatchMode):
    r"""A debugging / tracing mode that keeps every op's output (and a copy of its value
    at the time) -- a reference that exists before ``_holders``' "before" count."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "addcmul" in str(func):
            self.log.append((out, out.clone()))
        return out


def test_outputs_recorded_by_a_mode_are_never_written():
    x = torch.rand(4, 3)
    with _RecordOutputs() as mode:
        l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(0))
        l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(1))
    assert len(mode.log) == 4
    for out, value in mode.log:
        assert torch.equal(out, value)


def test_storage_swapped_in_by_f_is_never_written():
    x = torch.rand(4, 3)
    arrays, values = [], []

    def f(Z):
        arr = np.clip(Z.numpy(), 0.0, 1.0)  # f's own array, e.g. kept as a log of points
        Z.set_(torch.from_numpy(arr))
        arrays.append(arr)
        values.append(arr.copy())
        return Z.sum(-1)

    l1_gradient(f, x, 0.1, torch.Generator().manual_seed(0))
    l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1))
    assert len(arrays) == 4
    for arr, value in zip(arrays, values, strict=True):
        np.testing.assert_array_equal(arr, value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_reuse_on_the_gpu():
    # f may still read its input on another stream when it returns: every side gets a
    # fresh buffer off the CPU
    ptrs = []

    def f(Z):
        ptrs.append(Z.data_ptr())
        return Z.sum(-1)

    x = torch.rand(64, 8, device="cuda")
    l1_gradient(f, x, 0.1, torch.Generator(device="cuda").manual_seed(0))
    assert len(set(ptrs)) == 2
