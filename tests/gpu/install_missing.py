"""Install, from a wheelhouse only, the packages of tests/gpu/requirements.txt that this Python
lacks or has at a version outside the line's range (the GPU machine reaches no registry).

Usage: python3 tests/gpu/install_missing.py WHEELHOUSE TARGET
Wheels go into TARGET with ``pip install --no-index --no-deps --target`` (put TARGET first on
PYTHONPATH to use them); the machine's own packages are never changed. Prints one JSON line:
``{"installed": [...], "present": [...], "not_carried": [...]}``, each item "name version" or, for
``not_carried``, "name range: why"; exits 1 when a needed package is neither here nor carried,
or pip fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements.txt")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[tuple[str, str]]:
    """``(name, range)`` per line of requirements.txt, comments dropped."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [(m.group(1), m.group(2)) for line in lines if (m := re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", line))]


def satisfied(version: str, spec: str) -> bool:
    """Whether ``version`` is in ``spec`` ("" is any). Without `packaging` (not yet installed), any
    installed version counts; packaging itself is on the list, so the next run reads ranges."""
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return True
    return SpecifierSet(spec).contains(version, prereleases=True)


def main(wheelhouse: Path, target: Path) -> int:
    wheels: dict[str, list[Path]] = {}
    for w in sorted(wheelhouse.glob("*.whl")):
        wheels.setdefault(_norm(w.name.split("-")[0]), []).append(w)
    chosen: list[Path] = []
    report: dict[str, list[str]] = {"installed": [], "present": [], "not_carried": []}
    for name, spec in requirements():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have is not None and satisfied(have, spec):
            report["present"].append(f"{name} {have}")
            continue
        fits = [w for w in wheels.get(_norm(name), []) if satisfied(w.name.split("-")[1], spec)]
        if not fits:
            why = f"version {have} is outside the range" if have else "not installed"
            report["not_carried"].append(f"{name}{spec}: {why}, and no wheel in {wheelhouse} fits")
            continue
        chosen.append(fits[-1])
        report["installed"].append(f"{name} {fits[-1].name.split('-')[1]}" + (f" (over {have})" if have else ""))
    rc = 1 if report["not_carried"] else 0
    if chosen:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
             "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(target),
             *map(str, chosen)],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            report["pip_failed"] = [done.stderr.strip()[-2000:]]
            rc = 1
    print(json.dumps(report))
    return rc


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
