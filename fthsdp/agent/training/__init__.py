"""The training library inside each rank: what ``fthsdp.Manager`` is made of.

Layered (pyproject.toml's import-linter contract "Inside the training
library"; each imports only those below it, the two of one row never each
other): ``manager`` (the script's API); ``step`` (one step of the loop);
``catchup`` (a replica's way into the job); ``checkpoint``; ``ftar`` (the
cross-replica all-reduce) | ``session`` (the coordinator session);
``transport`` (gloo, NCCL) | ``state`` (the training state and its bytes);
``config`` | ``quorum_view`` (the coordinator's pushes, one copy).
"""
