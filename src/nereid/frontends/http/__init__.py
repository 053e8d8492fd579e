"""The KServe v2 HTTP/REST protocol with Triton's extensions."""
