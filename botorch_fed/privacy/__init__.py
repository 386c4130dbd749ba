r"""Local differential privacy for rewards: the Laplace mechanism of LDP-BO.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (2020):

- Curator 1, ``CTL(epsilon)`` (Sec. 4.1): a user reports its reward ``y`` as
  ``y + L`` with ``L ~ Laplace(2 (B + R) / epsilon)``, where ``B`` bounds ``|f(x)|``
  and ``R`` the observation noise. Lemma 1 (App. B): the sensitivity of ``y`` is
  ``2 (B + R)``, so each report is ``epsilon``-LDP.
  :class:`LaplaceMechanism` implements it and **clips** ``y`` to ``[-(B + R), B + R]``
  first: without clipping the guarantee fails for any reward outside the declared
  bound, with clipping it holds for every finite input.
- Sec. 4.5 (unbounded, sub-Weibull noise): :meth:`LaplaceMechanism.sub_weibull` picks
  ``R`` by a union bound so that, with probability ``>= 1 - delta``, no reward over the
  horizon exceeds the bound -- the paper's ``(epsilon, delta)``-LDP.

The guarantee is per release and per user: LDP protects each reported value, and a
user who answers ``k`` queries is ``k * epsilon``-LDP (basic composition, Dwork & Roth
2014, Thm 3.16). :class:`PrivacyLedger` keeps that account per user; attach one to a
mechanism and every release is recorded (with the number of clipped values).

This package imports only torch, ``cryptography`` (the noise's ChaCha20 key stream,
:class:`KeyStream`) and the standard library.
"""

from __future__ import annotations

from botorch_fed.privacy.laplace import LaplaceMechanism, sub_weibull_radius
from botorch_fed.privacy.ledger import PrivacyLedger
from botorch_fed.privacy.release_log import ReleaseLog, ReleaseLogError
from botorch_fed.privacy.stream import KeyStream

__all__ = [
    "KeyStream",
    "LaplaceMechanism",
    "PrivacyLedger",
    "ReleaseLog",
    "ReleaseLogError",
    "sub_weibull_radius",
]
