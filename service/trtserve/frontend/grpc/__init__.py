"""The gRPC door: the KServe v2 / Triton inference service, ModelControl, health and reflection on one
``grpc.aio`` server; the only importer of grpc."""
