"""Recipe: `trtserve build` writes this model's 1/model.onnx."""

from trtserve.testing.models import build_echo_bytes as build

__all__ = ["build"]
