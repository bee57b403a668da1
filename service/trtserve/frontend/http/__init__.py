"""The HTTP door: the KServe v2 REST API (with Triton's binary tensor extension) on uvicorn, over
the same front-end state as the gRPC door."""
