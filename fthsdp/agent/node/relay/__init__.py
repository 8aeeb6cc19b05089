"""The agent's local relay: its ranks reach the coordinator through it (issue 50).

Under ``fthsdp agent`` no rank opens a connection to the coordinator. The
agent serves the coordinator's job calls on a Unix socket in a private
folder (``server.py``) and forwards them over its own connection, one per
coordinator address for the whole host (``upstream.py``). A replica's
Watch, which every rank and the agent itself open with the same request,
is one upstream stream per host, its events handed to each local watcher
(``fanout.py``). The agent's own clients (its reporter, hang watch and
Host stream) use the relay too, so that a host holds one connection to the
coordinator whatever its ranks and TLS.

A script started on its own, or by another launcher, talks to the
coordinator directly as before: the relay is only what the agent hands its
ranks as FTHSDP_COORDINATOR.
"""
