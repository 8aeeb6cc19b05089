"""This rank's place in its job: the coordinator session and what the replica is.

Modules: ``membership`` (registration, the session's pushes, heartbeats),
``client`` (the coordinator's RPCs), ``heartbeat``, ``hang_notice``,
``job_finished``, ``reach_probe`` (the coordinator's reachability probes),
``replica_group`` (control collectives among the ranks of one replica),
``lifecycle`` (the replica's stage and how it ended), ``participation``
(its place in the next step's average).

Independent of ``ftar``: neither imports the other.
"""
