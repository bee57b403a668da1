"""Recipe: `trtserve build` writes this model's 1/model.onnx."""

from trtserve.testing.models import build_identity_fp32 as build

__all__ = ["build"]
