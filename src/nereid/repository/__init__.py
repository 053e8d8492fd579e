"""The model repository: folders on disk, versions and version policies, and the lifecycle of loaded models."""
