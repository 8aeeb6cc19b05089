"""The coordinator's engine: the decision loop, the runtime that answers calls, persistence."""
