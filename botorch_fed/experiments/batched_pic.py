r"""FBO-FedGP's models for a batched grid: every client of every replication one member.

A batched grid (:mod:`~botorch_fed.experiments.grid`) runs ``R`` replications of an
``M``-client federation as one program of ``B = R M`` members. FBO-FedGP's default step
puts each client on its PIC model ([Chen2013]; :class:`~botorch_fed.models.FederatedPICGP`):
its replication's summed dPITC summary on its replication's support plus its own data,
with its replication's kernel, noise and mean, and its replication's federated
standardisation. Here all of these are batched:

- :func:`batched_modules`: the global kernel, likelihood and mean of
  :func:`~botorch_fed.algorithms.fbo_fedgp.settings.global_modules` with batch shape
  ``B``, each member holding its replication's hyperparameters ``theta``;
- :func:`batched_summary_and_jacobian`: every member's packed summary and its Jacobian in
  its own ``theta`` (:meth:`~botorch_fed.models.PITCFitClient.summary_and_jacobian` of
  each member, as one computation);
- :class:`BatchedPICGP`: the ``B`` PIC models as one BoTorch model of batch shape ``B``
  (:func:`~botorch_fed.models.pic.pic_predict`, the maths of ``FederatedPICGP``).

References:

.. [Chen2013] J. Chen, N. Cao, K. H. Low, R. Ouyang, C. K.-Y. Tan and P. Jaillet.
   Parallel Gaussian process regression with low-rank covariance matrix
   approximations. UAI 2013 (pPIC).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from botorch.models.model import Model
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.posteriors import GPyTorchPosterior
from gpytorch.means import ConstantMean
from torch import Tensor

from botorch_fed.models import FederatedPITCGP, PITCHyperparameters, SparseSummary
from botorch_fed.models.local_summary import local_summary
from botorch_fed.models.pic import pic_block_factor, pic_predict
from botorch_fed.models.sparse_summary import summary_factor
from botorch_fed.models.support_set import support_cholesky


def batched_modules(thetas: Sequence[np.ndarray], dim: int, device=None):
    r"""The global kernel, likelihood and mean with batch shape ``B = len(thetas)``: member
    ``b`` holds ``thetas[b]`` (raw hyperparameters in the order of
    :class:`~botorch_fed.models.PITCHyperparameters` of
    :func:`~botorch_fed.algorithms.fbo_fedgp.settings.global_modules`).

    Args:
        thetas: One raw hyperparameter vector per member.
        dim: The input dimension.
        device: Where the modules live.

    Returns:
        ``(covar_module, likelihood, mean_module)`` in float64, batch shape ``B``.
    """
    batch = torch.Size([len(thetas)])
    covar = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim, batch_shape=batch)
    likelihood = get_gaussian_likelihood_with_lognormal_prior(batch_shape=batch)
    mean = ConstantMean(batch_shape=batch)
    modules = tuple(m.to(device=device, dtype=torch.float64) for m in (covar, likelihood, mean))
    params = batched_parameters(modules)
    values = torch.as_tensor(np.stack(thetas), dtype=torch.float64, device=params[0].device)
    if values.shape[1] != sum(p[0].numel() for p in params):
        raise ValueError(
            f"`thetas` hold {values.shape[1]} values; the modules take "
            f"{sum(p[0].numel() for p in params)}."
        )
    with torch.no_grad():
        i = 0
        for p in params:
            k = p[0].numel()
            p.copy_(values[:, i : i + k].reshape(p.shape))
            i += k
    return modules


def batched_parameters(modules) -> list[Tensor]:
    r"""The raw parameters of batched global modules in ``theta`` order (each with the
    batch dimension first)."""
    return list(PITCHyperparameters(*modules).parameters.values())


def support_groups(supports: Sequence[Tensor]) -> dict[int, list[int]]:
    r"""The members grouped by support size ``m`` (Alg. 1 may return fewer than ``|S|``
    points, so replications' supports can differ in size): ``{m: [members]}``."""
    groups: dict[int, list[int]] = {}
    for b, support in enumerate(supports):
        groups.setdefault(int(support.shape[0]), []).append(b)
    return groups


def batched_summaries(
    X: Tensor, Y: Tensor, supports: Sequence[Tensor], thetas: Sequence[np.ndarray]
) -> list[np.ndarray]:
    r"""Every member's packed whitened dPITC summary of its data on its support at its
    hyperparameters (:func:`~botorch_fed.models.compute_local_summary` of each member),
    computed as one batch per support size.

    Args:
        X: ``B x n x d`` inputs.
        Y: ``B x n x 1`` outcomes (transformed space).
        supports: ``B`` supports, member ``b``'s ``m_b x d``.
        thetas: ``B`` raw hyperparameter vectors of the global modules.

    Returns:
        ``B`` float64 arrays of length ``SparseSummary.packed_length(m_b)``.
    """
    out: list[np.ndarray] = [np.empty(0)] * len(supports)
    for members, S, modules in _grouped(X, supports, thetas):
        with torch.no_grad():
            packed = _summaries(X[members], Y[members], S, modules).pack()
        for b, row in zip(members, packed.cpu().numpy(), strict=True):
            out[b] = row
    return out


def _grouped(X: Tensor, supports: Sequence[Tensor], thetas: Sequence[np.ndarray]):
    r"""``(members, stacked supports, batched modules)`` per support size."""
    for members in support_groups(supports).values():
        S = torch.stack([supports[b] for b in members]).to(X.device, torch.float64)
        modules = batched_modules([thetas[b] for b in members], X.shape[-1], X.device)
        yield members, S, modules


def _summaries(X: Tensor, Y: Tensor, S: Tensor, modules) -> SparseSummary:
    covar, likelihood, mean = modules
    L = support_cholesky(S, covar)
    return local_summary(X.to(torch.float64), Y, S, L, covar, likelihood, mean)


def batched_summary_and_jacobian(
    X: Tensor, Y: Tensor, supports: Sequence[Tensor], thetas: Sequence[np.ndarray]
) -> list[np.ndarray]:
    r"""Every member's packed summary and its Jacobian in its own raw hyperparameters
    (:meth:`~botorch_fed.models.PITCFitClient.summary_and_jacobian` of each member).

    Member ``b``'s summary depends only on member ``b``'s parameters, so one
    Jacobian-vector product per hyperparameter (the double-backward trick) gives that
    column for every member of a support size at once: ``P`` backward passes per size,
    whatever ``B``.

    Args:
        X: ``B x n x d`` inputs.
        Y: ``B x n x 1`` outcomes (transformed space).
        supports: ``B`` supports, member ``b``'s ``m_b x d``.
        thetas: ``B`` raw hyperparameter vectors of the global modules.

    Returns:
        ``B`` float64 arrays ``[packed, jacobian.reshape(-1)]`` (``L_b + L_b P``, the
        Jacobian ``L_b x P`` row-major, as a client's fit contribution lays them out).
    """
    out: list[np.ndarray] = [np.empty(0)] * len(supports)
    for members, S, modules in _grouped(X, supports, thetas):
        params = batched_parameters(modules)
        with torch.enable_grad():
            packed = _summaries(X[members], Y[members], S, modules).pack()
            u = torch.zeros_like(packed, requires_grad=True)
            grads = torch.autograd.grad(
                packed, params, grad_outputs=u, create_graph=True, allow_unused=True
            )
            G = packed.shape[0]
            product = torch.cat(
                [p.new_zeros(G, p[0].numel()) if g is None else g.reshape(G, -1)
                 for p, g in zip(params, grads, strict=True)], dim=1,
            )  # fmt: skip  # G x P, linear in u
            columns = []
            for j in range(product.shape[1]):
                column = None
                if product[:, j].requires_grad:  # else the summaries do not depend on it
                    (column,) = torch.autograd.grad(
                        product[:, j].sum(), u, retain_graph=True, allow_unused=True
                    )
                columns.append(torch.zeros_like(packed) if column is None else column)
        jacobian = torch.stack(columns, dim=-1).detach()  # G x L x P
        rows = torch.cat([packed.detach(), jacobian.flatten(1)], dim=1).cpu().numpy()
        for b, row in zip(members, rows, strict=True):
            out[b] = row
    return out


class BatchedPICGP(Model):
    r"""``B`` clients' PIC models ([Chen2013]) as one BoTorch model of batch shape ``B``.

    Member ``b`` is the model ``FederatedPICGP.from_pitc(FederatedPITCGP(supports[b],
    summaries[b], *modules_b, outcome_transform=tf_b), block_X[b], block_Y[b])``, with
    ``modules_b`` the global modules at ``thetas[b]`` and ``tf_b`` the standardisation
    ``y = means[b] + stdvs[b] * z``: its posterior is that model's
    (:func:`~botorch_fed.models.pic.pic_predict`, the same maths), without observation
    noise. Members are computed in one batch per support size. The factors are computed
    once, at construction, from the tensors given, on their device (plain tensors: build
    the model where it runs; ``.to()`` does not move them). ``posterior`` takes inputs
    ``... x B x q x d`` (one batch entry per member, no broadcasting over members).

    Args:
        supports: ``B`` supports (member ``b``'s ``m_b x d``, unit cube).
        summaries: ``B`` summed summaries (member ``b``'s on ``m_b`` points, no batch).
        thetas: ``B`` raw hyperparameter vectors of the global modules.
        block_X: ``B x n x d`` each member's own inputs.
        block_Y: ``B x n x 1`` each member's own outcomes in the standardised space.
        means: ``B`` the members' standardisation means.
        stdvs: ``B`` the members' standardisation scales (positive).
    """

    num_outputs = 1

    def __init__(
        self,
        supports: Sequence[Tensor],
        summaries: Sequence[SparseSummary],
        thetas: Sequence[np.ndarray],
        block_X: Tensor,
        block_Y: Tensor,
        means: Tensor,
        stdvs: Tensor,
    ) -> None:
        super().__init__()
        B, n, d = block_X.shape
        lengths = {"supports": len(supports), "summaries": len(summaries), "thetas": len(thetas)}
        for name, length in lengths.items():
            if length != B:
                raise ValueError(f"`{name}` holds {length} members; `block_X` holds {B}.")
        for name, z, shape in (("block_Y", block_Y, (B, n, 1)), ("means", means, (B,)),
                               ("stdvs", stdvs, (B,))):  # fmt: skip
            if tuple(z.shape) != shape:
                raise ValueError(f"`{name}` has shape {tuple(z.shape)}, expected {shape}.")
        if not (stdvs > 0).all():
            raise ValueError("`stdvs` must be positive.")
        self.train_inputs = (block_X,)
        X_B = block_X.to(torch.float64)
        self._groups = []
        with torch.no_grad():
            for members, S, modules in _grouped(X_B, supports, thetas):
                covar, likelihood, mean = modules
                L_S = support_cholesky(S, covar)
                summary = SparseSummary.unpack(
                    torch.stack([summaries[b].pack() for b in members]).to(X_B), S.shape[-2]
                )
                L_B, v = summary_factor(summary)
                index = torch.tensor(members, device=X_B.device)
                block = pic_block_factor(S, L_S, L_B, X_B[index], block_Y[index], covar,
                                         likelihood, mean)  # fmt: skip
                self._groups.append((index, (S, L_S, L_B, v, X_B[index], *block), covar, mean))
        self._means, self._stdvs = means.to(X_B), stdvs.to(X_B)

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([self.train_inputs[0].shape[0]])

    def posterior(  # type: ignore[override]
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool = False,
        posterior_transform=None,
    ) -> GPyTorchPosterior:
        r"""The members' PIC posteriors at ``X`` (``... x B x q x d``), untransformed.

        Raises:
            NotImplementedError: For observation noise, output indices or a posterior
                transform (the grid's UCB needs none).
        """
        if output_indices not in (None, [0]) or observation_noise is not False:
            raise NotImplementedError("BatchedPICGP: no output indices or observation noise.")
        if posterior_transform is not None:
            raise NotImplementedError("BatchedPICGP: no posterior transform.")
        B, q = self.batch_shape[0], X.shape[-2]
        if X.ndim < 3 or X.shape[-3] != B:
            raise ValueError(f"`X` must be `... x {B} x q x d`, got {tuple(X.shape)}.")
        mean = X.new_empty(*X.shape[:-1], dtype=torch.float64)
        cov = X.new_empty(*X.shape[:-1], q, dtype=torch.float64)
        if len(self._groups) == 1:  # every member one support size: no gather, no scatter
            _, factors, covar, mean_module = self._groups[0]
            mean, cov = pic_predict(factors, covar, mean_module, X)
        for index, factors, covar, mean_module in self._groups if len(self._groups) > 1 else ():
            m, c = pic_predict(factors, covar, mean_module, X.index_select(-3, index))
            mean, cov = mean.index_copy(-2, index, m), cov.index_copy(-3, index, c)
        mu, sd = self._means.unsqueeze(-1), self._stdvs.unsqueeze(-1)
        mean, cov = mu + sd * mean, (sd * sd).unsqueeze(-1) * cov
        return GPyTorchPosterior(distribution=FederatedPITCGP._mvn(mean, cov, X.dtype))
