"""Client-side tools: `perf` (load generator) and `analyze` (config search). They speak the v2 protocol like
any client and never import the server's core, scheduling, backends or frontends."""
