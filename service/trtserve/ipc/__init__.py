"""The contract between front ends and the engine core: the one package both sides import (typed
messages, tensor framing, the ZeroMQ channel, the admission rule, the engine as a front end sees it)."""
