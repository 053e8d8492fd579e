"""Protocol frontends: translate wire formats to core types and back; they reach models only via the Server."""
