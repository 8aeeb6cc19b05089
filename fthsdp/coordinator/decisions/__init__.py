"""The job's decisions: pure rules over what the coordinator knows, the clock passed in."""
