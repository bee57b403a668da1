"""The pieces of ``trtserve bulk``: reading the input (``source``), the resumable Parquet output
(``sink``), the servers and their streams (``endpoints``), what a run did (``summary``) and the
streaming job against one or many servers (``job``). ``trtserve.tools.bulklib.ray`` reuses
``source``, ``sink`` and ``summary`` for the Ray Data path."""
