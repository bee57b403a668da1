"""The developer harness: the demo on real data, the benchmark, the soak run and the
dispatch-policy simulator (not the serving path). ``trtserve demo``, ``bench`` and ``simulate``
load it by name; it needs the ``bench`` extra (``pip install 'trtserve[bench]'``), and nothing
of the product imports it (an import contract in ``pyproject.toml`` says so)."""
