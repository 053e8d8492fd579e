"""The OpenAI-compatible API frontend."""

from nereid.frontends.openai.app import OpenAIApp, is_openai_path

__all__ = ["OpenAIApp", "is_openai_path"]
