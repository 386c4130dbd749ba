r"""BoTorch models of botorch-fed.

- :class:`FederatedPITCGP`: the distributed PITC sparse GP (dPITC) of [FBO-FedGP]
  built from aggregated client summaries (:func:`compute_local_summary`,
  :class:`SparseSummary`).
- :class:`PITCFitClient` / :class:`PITCHyperparameters` / :func:`pitc_loss_and_adjoint`:
  the pieces of the federated hyperparameter fit (run by
  :mod:`botorch_fed.protocol.federated_fit`); :class:`PITCMarginalLogLikelihood` fits the
  same objective with ``fit_gpytorch_mll`` when all clients' data are in one process.
- :class:`FederatedPICGP`: the client-side distributed PIC sparse GP (pPIC): dPITC plus the
  client's own data block, exact covariance with that block (:meth:`FederatedPICGP.from_pitc`).
- :func:`fit_exact_gp` / :class:`ExactGPRefitter`: the one exact ``SingleTaskGP`` fit
  (a party's own data: local GPs, pooled-data GPs); :func:`exact_mll_closure`: its loss
  closure for ``fit_gpytorch_mll`` (BoTorch's loss from one dense Cholesky).
- :func:`bures_wasserstein_barycenter`: the Wasserstein barycenter of Gaussians
  (Co-KG's central model), warm-startable; :class:`BarycenterGP`: that barycenter of the
  agents' posteriors on a support as a BoTorch GP on the whole domain (:func:`agent_weights`).
- :func:`sample_dictionary` / :class:`NystromEmbedding` / :func:`nystrom_embedding`: the
  variance-sampled Nystrom feature map of [LDP-BO] Alg. 4; :class:`FeatureSpaceGP`: the
  feature-space surrogate of LDP-ATA-GP-UCB / MoMA-GP-UCB; :func:`ridge_estimate`,
  :func:`ata_estimate`, :func:`median_of_means_estimate`: its plain, truncated (TOFU) and
  median-of-means estimates.
"""

from botorch_fed.models.agent_weights import AGENT_WEIGHTS, agent_weights
from botorch_fed.models.barycenter import bures_wasserstein_barycenter
from botorch_fed.models.barycenter_gp import BarycenterGP
from botorch_fed.models.exact_gp import (
    ExactGPRefitter,
    check_exact_gp_state,
    exact_gp_state,
    fit_exact_gp,
)
from botorch_fed.models.exact_mll import exact_mll_closure
from botorch_fed.models.feature_gp import FeatureSpaceGP
from botorch_fed.models.federated_standardize import (
    CENTRED_MOMENTS_LENGTH,
    MOMENTS_AROUND_LENGTH,
    OUTCOME_MOMENTS_LENGTH,
    center_from_moments,
    centred_moments,
    moments_around,
    outcome_count,
    outcome_moments,
    outcome_statistics,
    standardize_around,
    standardize_from_moments,
    statistics_around,
)
from botorch_fed.models.local_summary import compute_local_summary
from botorch_fed.models.marginals import (
    ExactGPMarginals,
    FederatedPITCMarginals,
    MarginalPredictor,
    marginal_predictor,
)
from botorch_fed.models.nystrom import NystromEmbedding, nystrom_embedding, sample_dictionary
from botorch_fed.models.pic import FederatedPICGP
from botorch_fed.models.pitc import FederatedPITCGP
from botorch_fed.models.pitc_fit import PITCFitClient, PITCHyperparameters, pitc_loss_and_adjoint
from botorch_fed.models.pitc_mll import PITCMarginalLogLikelihood
from botorch_fed.models.pitc_snapshot import HyperparametersChangedError
from botorch_fed.models.robust_estimators import (
    ata_estimate,
    median_of_means_estimate,
    ridge_estimate,
)
from botorch_fed.models.sparse_summary import SparseSummary, pitc_log_marginal_likelihood
from botorch_fed.models.support_set import default_jitter, support_cholesky

__all__ = [
    "ExactGPMarginals",
    "FederatedPITCMarginals",
    "MarginalPredictor",
    "marginal_predictor",
    "AGENT_WEIGHTS",
    "BarycenterGP",
    "agent_weights",
    "bures_wasserstein_barycenter",
    "CENTRED_MOMENTS_LENGTH",
    "OUTCOME_MOMENTS_LENGTH",
    "MOMENTS_AROUND_LENGTH",
    "ExactGPRefitter",
    "check_exact_gp_state",
    "exact_gp_state",
    "fit_exact_gp",
    "exact_mll_closure",
    "FederatedPICGP",
    "FederatedPITCGP",
    "HyperparametersChangedError",
    "PITCMarginalLogLikelihood",
    "PITCFitClient",
    "PITCHyperparameters",
    "center_from_moments",
    "centred_moments",
    "moments_around",
    "outcome_count",
    "outcome_moments",
    "outcome_statistics",
    "pitc_loss_and_adjoint",
    "SparseSummary",
    "compute_local_summary",
    "default_jitter",
    "pitc_log_marginal_likelihood",
    "standardize_from_moments",
    "standardize_around",
    "statistics_around",
    "support_cholesky",
    "FeatureSpaceGP",
    "NystromEmbedding",
    "nystrom_embedding",
    "sample_dictionary",
    "ata_estimate",
    "median_of_means_estimate",
    "ridge_estimate",
]
