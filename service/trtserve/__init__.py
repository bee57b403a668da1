"""trtserve: a gRPC inference microservice with a deadline-aware batching dispatcher."""

__version__ = "0.1.0"
