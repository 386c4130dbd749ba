from botorch_fed.algorithms.fbo_fedgp.client import FBOFedGPClient
from botorch_fed.algorithms.fbo_fedgp.server import FBOFedGPServer
from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings

__all__ = ["FBOFedGPClient", "FBOFedGPServer", "FBOFedGPSettings"]
