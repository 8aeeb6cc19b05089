"""What the coordinator keeps of a job in the store: the key layout and the wire codec."""
