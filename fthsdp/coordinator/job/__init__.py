"""One job's membership table: replicas, their calls, the checks that take members out."""
