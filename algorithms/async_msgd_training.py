"""Asynchronous momentum SGD: ``async_sgd`` whose servers keep a momentum buffer
(the Async MSGD baseline of You, Buluç, Demmel SC17).

Same messages as ``async_sgd`` (one push and one pull of model bytes per step); the server's update
reads and writes the momentum too. Which update a server applies is the trainer's configuration
(``momentum``), so the role programs are those of ``async_sgd``.
"""

from __future__ import annotations

from ddlsim.algorithms.async_sgd_training import AsyncSgdTraining
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS


class AsyncMsgdTraining(AsyncSgdTraining):
    name = "async_msgd"
    options = ("servers",)
    momentum = True
    summary = "asynchronous parameter server, momentum SGD on the server"


TRAINING_ALGORITHMS.register("async_msgd")(AsyncMsgdTraining())
