"""The GPU check's driver (tests/gpu/run.sh calls it once the packages and files are in place).

Runs each part as its own pytest process under a time limit and writes one JSON and one Markdown
table to ``--out``: every part and every test in it PASSED, FAILED or SKIPPED, with the reason
(the skip's sentence, the failure's first line); overall FAILED if a part failed, PASSED if a
part of tests passed, else SKIPPED. A part's result: FAILED if any of its tests
failed or it ran out of time; PASSED if one passed; else SKIPPED with its tests' reasons. Where
``nvidia-smi`` sees a GPU, a part that needs nothing but the GPU and passed nothing is FAILED: on
a GPU machine, a check that ran nothing must not pass. Exit status 1 when any part FAILED.

Usage: python3 tests/gpu/check.py --out DIR [--packages packages.json] [--only PART]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Part:
    """One pytest run of the check.

    Attributes:
        name: the part's name in the tables.
        tests: pytest node ids, relative to the repository root.
        limit_s: wall-clock seconds before the run is killed (it is then FAILED).
        gpu_only: needs nothing but a GPU (no TensorRT), so skipping all of it where a GPU is seen fails.
    """

    name: str
    tests: tuple[str, ...]
    limit_s: int
    gpu_only: bool


PARTS = (
    Part("CUDA layer", ("tests/gpu/test_cuda_layer.py",), 90, True),
    Part("TensorRT runtime on a stand-in context", ("tests/gpu/test_standin_context.py",), 240, True),
    Part(
        "TensorRT plans",
        ("tests/gpu/test_tensorrt_gpu.py", "tests/gpu/test_tensorrt_concurrent_slots.py",
         "tests/unit/test_tensorrt_cpu.py::test_tensorrt_stub_names_and_enum_values_hold_in_the_installed_tensorrt"),
        150,
        False,
    ),
    Part("PyTorch platform on the GPU", ("tests/gpu/test_torch_gpu.py",), 300, True),
)


def first_line(text: str | None) -> str:
    """The first non-empty line of a message, without pytest's "Skipped: " prefix."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip().removeprefix("Skipped: ")
    return ""


def gpu_row() -> dict[str, str]:
    """The machine's GPU as nvidia-smi reports it (PASSED), or why there is none (SKIPPED)."""
    if shutil.which("nvidia-smi") is None:
        return {"status": "SKIPPED", "reason": "nvidia-smi is not on this machine: no NVIDIA driver, no GPU to check"}
    query = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "FAILED", "reason": f"nvidia-smi is here but did not answer: {exc}"}
    if done.returncode != 0 or not done.stdout.strip():
        return {"status": "FAILED", "reason": f"nvidia-smi failed: {first_line(done.stderr or done.stdout)}"}
    return {"status": "PASSED", "reason": done.stdout.strip().splitlines()[0]}


def run_part(part: Part, log: Path) -> tuple[list[dict[str, str]], str | None]:
    """Run ``part``'s tests; its rows (test, status, reason) and, if it did not finish, why."""
    report = log.with_suffix(f".{part.tests[0].split('/')[-1].split('.')[0]}.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider", f"--junitxml={report}",
           "-o", f"timeout={part.limit_s}", *part.tests]
    with log.open("a") as sink:
        sink.write(f"\n== {part.name}: {' '.join(cmd)}\n")
        sink.flush()
        try:
            subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, timeout=part.limit_s + 30)
            unfinished = None
        except subprocess.TimeoutExpired:
            unfinished = f"did not finish within {part.limit_s + 30} s"
    rows: list[dict[str, str]] = []
    if report.is_file():
        for case in ET.parse(report).getroot().iter("testcase"):
            test = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            if bad is not None:
                rows.append({"test": test, "status": "FAILED",
                             "reason": first_line(bad.get("message")) or first_line(bad.text)})
            elif skipped is not None:
                rows.append({"test": test, "status": "SKIPPED", "reason": first_line(skipped.get("message"))})
            else:
                rows.append({"test": test, "status": "PASSED", "reason": ""})
        report.unlink()
    return rows, unfinished


def verdict(rows: list[dict[str, str]], unfinished: str | None, gpu_seen: bool, part: Part) -> dict[str, str]:
    """A part's status and reason from its tests' rows (see the module docstring)."""
    statuses = [r["status"] for r in rows]
    if unfinished or not rows:
        return {"status": "FAILED", "reason": unfinished or "pytest collected nothing (see the log)"}
    if "FAILED" in statuses:
        return {"status": "FAILED", "reason": f"{statuses.count('FAILED')} of {len(rows)} tests failed"}
    passed = statuses.count("PASSED")
    reasons = sorted({r["reason"] for r in rows if r["status"] == "SKIPPED"})
    if passed:
        return {"status": "PASSED", "reason": f"{passed} passed, {len(rows) - passed} skipped"}
    if gpu_seen and part.gpu_only:
        return {"status": "FAILED", "reason": "nvidia-smi sees a GPU but every test skipped: " + "; ".join(reasons)}
    return {"status": "SKIPPED", "reason": "; ".join(reasons)}


def markdown(result: dict) -> str:
    """The results as one Markdown table: a row per part, then a row per test under it."""
    lines = [f"GPU check, {result['started']}, {result['seconds']} s: **{result['status']}**", "",
             "| part | test | result | reason |", "| --- | --- | --- | --- |"]
    for part in result["parts"]:
        lines.append(f"| **{part['name']}** | | **{part['status']}** | {part['reason'].replace('|', '/')} |")
        for row in part.get("tests", []):
            lines.append(f"| | {row['test']} | {row['status']} | {row['reason'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json, .md and .log")
    parser.add_argument("--packages", type=Path, help="install_missing.py's JSON line")
    parser.add_argument("--only", default="", help="run only the parts whose name contains this (a rerun of one)")
    args = parser.parse_args(argv)
    parts_run = [p for p in PARTS if args.only.lower() in p.name.lower()]
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "gpu-check.log").resolve()
    log.write_text("")
    started, t0 = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.perf_counter()
    parts: list[dict] = []
    gpu = gpu_row()
    parts.append({"name": "GPU", **gpu})
    if args.packages is not None:
        try:
            packages = json.loads(args.packages.read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as exc:
            packages = {"not_carried": [f"install_missing.py wrote no report ({exc})"]}
        missing = packages.get("not_carried", []) + packages.get("pip_failed", [])
        installed = ", ".join(packages.get("installed", [])) or "none"
        parts.append({"name": "Packages", "status": "FAILED" if missing else "PASSED",
                      "reason": ("; ".join(missing) if missing else f"installed from the wheelhouse: {installed}"),
                      "packages": packages})
    for part in parts_run:
        rows, unfinished = run_part(part, log)
        parts.append({"name": part.name, **verdict(rows, unfinished, gpu["status"] == "PASSED", part), "tests": rows})
    result = {
        "started": started,
        "seconds": round(time.perf_counter() - t0, 1),
        "python": sys.version.split()[0],
        "host": os.uname().nodename,
        "status": ("FAILED" if any(p["status"] == "FAILED" for p in parts)
                   else "PASSED" if any(p["status"] == "PASSED" for p in parts[-len(parts_run):]) else "SKIPPED"),
        "parts": parts,
    }
    (args.out / "gpu-check.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    (args.out / "gpu-check.md").write_text(table)
    print(table)
    return 1 if result["status"] == "FAILED" else 0


if __name__ == "__main__":
    sys.exit(main())
