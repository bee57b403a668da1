"""The queue door: inference requests read from Redis Streams, answered into result keys and reply
streams (:mod:`trtserve.frontend.queue.door`; the message format: :mod:`trtserve.protocol.queue`)."""
