"""The tools around the server: one module per ``trtserve`` subcommand (demo, check, bench)."""
