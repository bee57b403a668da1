"""Bulk inference on Ray Data (``pip install 'trtserve[ray]'``): the public face of
:mod:`trtserve.tools.bulklib.ray`, which says how to use it."""

from trtserve.tools.bulklib.ray import TrtserveModel, embed_dataset, init_local, read_dataset

__all__ = ["TrtserveModel", "embed_dataset", "init_local", "read_dataset"]
