"""FTAR: one step's gradients summed across the replicas of the quorum.

Modules: ``allreduce`` (the ``FTAR`` object: one step's sum, phase by phase),
``protocol`` (the phases and the way from one to the next, a pure table),
``decisions`` (what the members do after an agree, pure), ``vote`` (the
commit vote: one decision per step), ``groups`` (the quorums' process groups
and the waits on them together with the coordinator's push), ``overlap``,
``buckets`` and ``buffer_pool`` (buckets started during the backward pass),
``results`` (what a step returns and asks of its caller).

Imports ``transport`` and ``state`` below it, never ``session``, ``catchup``
or ``step`` (pyproject.toml's import-linter contracts).
"""
