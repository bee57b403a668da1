"""The tools around the server: one module per ``trtserve`` subcommand (build, check, profile,
policy, bulk), and the parts they share.

A tool that cannot do its job (no such repository or model, a model that does not load)
raises :class:`ToolError`; its ``run`` prints the message as one line on stderr and exits 2,
never with a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path


class ToolError(Exception):
    """A tool cannot run; the message is the one sentence to show (what is wrong, and where)."""


def model_dir(root: Path, name: str) -> Path:
    """``root/name`` if it is a model directory (it holds a ``config.pbtxt``).

    Raises:
        ToolError: ``root`` is not a directory, holds no model, or holds no model ``name``
            (the message lists the models it does hold).
    """
    from trtserve.repository import CONFIG_FILE

    root = Path(root)
    if not root.is_dir():
        where = "" if root.is_absolute() else f" (relative to {Path.cwd()})"
        raise ToolError(f"model repository '{root}' is not a directory{where}; pass --model-repository DIR")
    found = sorted(p.name for p in root.iterdir() if (p / CONFIG_FILE).is_file())
    if name not in found:
        if not found:
            raise ToolError(f"model repository '{root}' holds no model (no <model>/{CONFIG_FILE}); "
                            "pass --model-repository DIR")
        why = f" ('{root / name}' has no {CONFIG_FILE})" if (root / name).is_dir() else ""
        raise ToolError(f"no model '{name}' in repository '{root}'{why}; it holds: {', '.join(found)}")
    return root / name


def model_failure(name: str, what: str, exc: BaseException) -> ToolError:
    """The one-line error for model ``name`` failing (``what``: "cannot load", ...) with ``exc``.

    trtserve's own errors are sentences already; anything else (a broken model file, a
    handler's bug) is shown with its type.
    """
    from trtserve.errors import TrtServeError
    from trtserve.repository import ConfigError

    reason = str(exc) if isinstance(exc, (ConfigError, TrtServeError)) and str(exc) else f"{type(exc).__name__}: {exc}"
    return ToolError(f"model '{name}' {what}: {reason}")


def fail(tool: str, exc: ToolError) -> int:
    """Print ``exc`` as ``trtserve TOOL: ...`` on stderr; the exit status 2."""
    print(f"trtserve {tool}: {exc}", file=sys.stderr)
    return 2
