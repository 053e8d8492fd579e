"""The cloud endpoints tritonserver can serve beside HTTP and gRPC: SageMaker (--allow-sagemaker) and Vertex AI
(--allow-vertex-ai), each an HTTP frontend over the Server that reuses the HTTP frontend's codec and transport."""
