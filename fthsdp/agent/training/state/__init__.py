"""The training state a replica commits, and its bytes.

Modules: ``train_state`` (the model, optimizer and script state of one
replica, with its step), ``codec`` (tensors to and from bytes, no pickle),
``snapshot`` (a host copy of the state for a joiner), ``checksum`` (the
state's checksum the coordinator compares across replicas),
``running_buffers`` (batch-norm statistics summed from one member).

The bottom of the training library with ``transport``: imports neither
above it.
"""
