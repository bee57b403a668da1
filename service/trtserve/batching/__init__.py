"""Batching: the per-model queue, the pure dispatch decision, the dispatcher loop, and the latency
and wait predictions they use."""
