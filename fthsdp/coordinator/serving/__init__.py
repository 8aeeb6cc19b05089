"""The coordinator's edge: the gRPC servicer and its streams, the web status page and metrics."""
