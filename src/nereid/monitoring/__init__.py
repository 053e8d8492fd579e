"""Model monitoring: input and output drift against a reference profile, data quality, and a sampled payload log.
It observes finished requests through a bounded queue, off the request path, and never delays or fails one."""
