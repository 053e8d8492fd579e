"""Model configuration: config.pbtxt parsing into Triton's ModelConfig protobuf, validation, JSON views.

Needs no ML framework; backends contribute auto-complete through their own modules.
"""
