r"""FBO-FedGP (paper 000, Alg. 1 + Alg. 2): a distributed sparse GP from dPITC summaries
on a shared support, summed under secure aggregation."""

from botorch_fed.algorithms.fbo_fedgp.client import FBOFedGPClient
from botorch_fed.algorithms.fbo_fedgp.server import FBOFedGPServer
from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["FBOFedGPClient", "FBOFedGPServer", "FBOFedGPSettings"]

register_algorithm(
    AlgorithmSpec(
        name="fbo-fedgp",
        summary=(
            "FBO-FedGP: GP-UCB on each client's distributed PIC model, built from dPITC "
            "summaries under secure aggregation (paper 000; --preset paper: Alg. 2's mix of "
            "local and global dPITC steps)"
        ),
        settings_class=FBOFedGPSettings,
        make_client=lambda ctx, cid: FBOFedGPClient(
            secagg=ctx.secagg_clients[cid],
            num_clients=ctx.setup.num_clients,
            run_seed=ctx.setup.seed,
            **ctx.client_arguments(cid),
        ),
        make_server=lambda ctx, transport: FBOFedGPServer(
            transport, ctx.settings, ctx.dim, ctx.secagg_server, seed=ctx.setup.seed
        ),
        secure_aggregation=True,
        min_clients=2,
    )
)
