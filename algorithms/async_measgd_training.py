"""Async MEASGD (You, Buluç, Demmel SC17): Async EASGD whose workers take momentum steps locally
(EAMSGD, Zhang et al. 2015, Algorithm 2, with heavy-ball momentum).

Messages as ``async_easgd``; the workers' trainers carry a momentum buffer (``momentum``).
"""

from __future__ import annotations

from ddlsim.algorithms.async_easgd_training import AsyncEasgdTraining
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS


class AsyncMeasgdTraining(AsyncEasgdTraining):
    name = "async_measgd"
    momentum = True
    summary = "async EASGD with momentum in the workers' local steps"


TRAINING_ALGORITHMS.register("async_measgd")(AsyncMeasgdTraining())
