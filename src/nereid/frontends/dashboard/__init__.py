"""The operator dashboard at /dashboard: the committed page bundle and the read-only JSON it polls."""
