"""One step of the training loop, as the script's ``Manager`` runs it.

Modules: ``replica_step`` (a member's step: FTAR, commit, snapshots,
checkpoints), ``standalone`` (a replica with no coordinator), ``connection``
(what links a rank to its job, opened by ``Manager.start()``), ``buffer``
(the flat gradient buffer of a step), ``clock`` (step timing published to
the heartbeat), ``script_hooks`` (the user's update and state callbacks),
``eviction`` (the eviction watch of a multi-rank replica group).

Above every other part but the ``Manager`` (fthsdp/agent/training/manager.py).
"""
