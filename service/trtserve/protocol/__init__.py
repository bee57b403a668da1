"""The KServe v2 tensor codec (protobuf tensors to numpy views and back, validated) and request parameters."""
