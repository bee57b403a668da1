"""The parts of ``trtserve bench``: CPU time from /proc (``cpu``), the inputs
(``workload``), the raw engine reference (``raw``), the load generators (``load``), the pure
statistics and target checks (``report``) and the plots (``plots``)."""
