"""Front ends: what every door does (the served models, the in-flight gate, graceful drain), and one
folder per transport (``grpc/``). A front end reaches the engine core only through :mod:`trtserve.ipc`."""
