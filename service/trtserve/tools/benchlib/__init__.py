"""The parts of ``trtserve bench``: the server under test (``server``), its inputs
(``workload``), the raw engine reference (``raw``), the load generators (``load``), the pure
statistics and target checks (``report``) and the plots (``plots``)."""
