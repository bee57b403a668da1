"""The engine core: the live models, their dispatchers and execution slots, and the answers to the
front ends (never a transport: front ends speak to it through :mod:`trtserve.ipc`)."""
