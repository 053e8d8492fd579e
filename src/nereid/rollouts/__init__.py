"""Safe rollouts: traffic between versions of one model (weighted split, sticky keys, shadow copies), steps behind
evidence gates, and automatic rollback. The Server asks it for a version at resolve time and tells it how each
request ended; it never touches wire formats or the repository's internals."""
