"""Catch-up: a joining replica copies the committed state from a healthy peer.

Modules: ``joiner`` (a replica's way into the job: register, find a source,
copy, replay, wait for admission), ``client`` and ``server`` (the HTTP
transfer of snapshots and the gradient log), ``source`` (what a replica
serves: its state, taken at a step boundary), ``target`` (a restore's
target state), ``group`` (the ranks of a replica group copying together),
``replay`` (the one place the joiner's step moves: the log replayed),
``grad_log`` (the committed gradients kept for joiners), ``last_gap`` (the
step or two a joiner still lacks when admitted), ``tls``.

Above ``ftar``, ``checkpoint``, ``session`` and ``state``; below ``step``.
"""
