"""Recipe: `trtserve build` writes this model's 1/model.onnx."""

from trtserve.tools.testmodels import build_identity_fp32 as build

__all__ = ["build"]
