"""The pieces of ``trtserve bulk``: reading the input (``source``), the resumable Parquet output
(``sink``), and the streaming job against one or many servers (``job``). ``trtserve.tools.bulklib.ray`` reuses
``source`` and ``sink`` for the Ray Data path."""
