r"""An agent's RBF prior in original outcome units, the kernel built from shared
hyperparameters, and the nearest positive semi-definite covariance (Co-KG, paper 001:
the agents' posteriors share one prior)."""

from __future__ import annotations

import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor


def original_hyperparameters(model: SingleTaskGP) -> dict[str, Tensor]:
    r"""A fitted ``SingleTaskGP``'s hyperparameters in original outcome units (on outcomes
    standardised by ``m_y``, ``s_y``: prior ``GP(m_y + s_y c, s_y^2 k)``, noise ``s_y^2
    sigma^2``).

    Args:
        model: RBF or scaled RBF kernel, constant mean, optional ``Standardize``.

    Returns:
        ``lengthscale`` (``d``), 0-dim ``outputscale``, ``noise``, ``mean_constant``.

    Raises:
        UnsupportedError: Another kernel or outcome transform.
    """

    def f64(value: Tensor) -> Tensor:
        return value.detach().to(torch.float64)

    covar, scale = model.covar_module, torch.ones((), dtype=torch.float64)
    if isinstance(covar, ScaleKernel):
        scale, covar = f64(covar.outputscale).reshape(()), covar.base_kernel
    if not isinstance(covar, RBFKernel):
        name = type(covar).__name__
        raise UnsupportedError(
            f"Co-KG's shared prior is an RBF kernel; the agent's model has a {name}."
        )
    d = model.train_inputs[0].shape[-1]
    mean_y, std_y = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    transform = getattr(model, "outcome_transform", None)
    if transform is not None:
        if not hasattr(transform, "stdvs"):
            name = type(transform).__name__
            raise UnsupportedError(f"Co-KG reads a Standardize outcome transform, got {name}.")
        mean_y, std_y = f64(transform.means).reshape(()), f64(transform.stdvs).reshape(())
    return {
        "lengthscale": f64(covar.lengthscale).reshape(-1).expand(d).clone(),
        "outputscale": scale * std_y**2,
        "noise": f64(model.likelihood.noise).reshape(-1)[0] * std_y**2,
        "mean_constant": mean_y + std_y * f64(model.mean_module.constant).reshape(()),
    }


def nearest_psd(C: Tensor) -> Tensor:
    r"""``C`` symmetrised, negative eigenvalues clipped if rounding made it indefinite."""
    C = 0.5 * (C + C.transpose(-1, -2))
    scale = C.diagonal().abs().max().clamp_min(1e-300)
    eye = torch.eye(C.shape[-1], dtype=C.dtype)
    if torch.linalg.cholesky_ex(C + 1e-13 * scale * eye).info == 0:
        return C
    evals, evecs = torch.linalg.eigh(C)
    C = (evecs * evals.clamp_min(0.0)) @ evecs.transpose(-1, -2)
    return 0.5 * (C + C.transpose(-1, -2))


def shared_kernel(lengthscale: Tensor, outputscale: Tensor) -> ScaleKernel:
    r"""``outputscale * RBF(lengthscale)`` (``d`` lengthscales) as a float64 kernel."""
    d = lengthscale.numel()
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(torch.float64)
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, d).to(torch.float64)
    kernel.outputscale = outputscale.to(torch.float64).reshape(())
    return kernel
