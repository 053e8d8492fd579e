"""LLM serving with Triton's vLLM-backend conventions: backend name "vllm", engine chosen by model.json."""

from nereid.backends.llm.backend import BACKEND, LlmBackend

__all__ = ["BACKEND", "LlmBackend"]
