"""The parts of ``trtserve bench``: the inputs (``workload``), the raw engine reference (``raw``),
the load generators (``load``, and the Go binary's ``goclient``, both filling ``records``), what
each mode measures (``sweeps``), CPU time and memory from /proc (``proctree``), the pure
statistics and target checks (``report``, ``deadlines``, ``compare``, ``policies``,
``overload``), the plots (``plots``) and the Triton peer (``peer``, ``pytriton_server``)."""
