"""The hosts of a job's groups of several hosts: rendezvous rounds, spares, the Host stream."""
