"""Triton's own QA units (`qa/L0_*` of triton-inference-server/server) against Nereid, or against the reference Triton.

    python -m benchmarks.triton_qa --qa /path/to/server/qa [--server nereid|triton] [--work DIR] [UNIT ...]

`--qa` is a local copy of Triton's `qa/` folder (fetched outside the checkout; nothing of it is committed). For each
unit this builds the model repository the unit's test.sh builds, starts the server with the unit's flags on ports
8000/8001/8002 with its log where the unit reads it, runs the unit's test files unmodified as test.sh runs them
(`python <file>`, unittest's verbose report), and prints a table of the cases passed, failed and not run, each failure
and skip with its reason. The log checks test.sh makes after a run count as cases of their own. Not part of
`make test`: CI has no copy of Triton's repository; each behaviour a unit found has a test of Nereid's own in tests/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = ["Case", "Run", "Unit", "copy_python_model", "edit_config", "generated", "main", "parse_pytest", "parse_unittest"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Case:
    name: str
    outcome: str  # passed | failed | skipped
    reason: str = ""


@dataclass
class Run:
    """One server start of a unit and the test files run against it."""

    name: str
    server_args: list[str]
    tests: list[str]  # python files, run as test.sh runs them; "file.py Case" runs a unittest selection
    server_log: str
    env: dict[str, str] = field(default_factory=dict)
    absent_from_log: list[str] = field(default_factory=list)  # test.sh's greps that must find nothing
    present_in_log: list[str] = field(default_factory=list)
    refuses_to_start: str = ""  # the server must exit before it is ready, with this message in its log
    log_settings: list[dict[str, object]] = field(default_factory=list)  # test.sh's curl POSTs to /v2/logging first
    log_counts: dict[str, int] = field(default_factory=dict)  # test.sh's `grep -c` of the log: lines that must match


@dataclass
class Unit:
    folder: str  # under qa/
    build: Callable[[Path, Path], None]  # (unit folder, qa folder): lay out models/ as test.sh does
    runs: list[Run]
    python_models_only: bool = True  # the reference Triton (Python backend only) can run it
    note: str = ""


# -- what unit modules share ------------------------------------------------------------------------------
def copy_python_model(qa: Path, models: Path, source: str, name: str | None = None) -> Path:
    target = models / (name or source)
    (target / "1").mkdir(parents=True)
    shutil.copy(qa / "python_models" / source / "model.py", target / "1" / "model.py")
    config = qa / "python_models" / source / "config.pbtxt"
    if config.exists():
        shutil.copy(config, target / "config.pbtxt")
    return target


def edit_config(model: Path, name: str, max_batch_size: int | None = None, append: str = "", replace: tuple[str, str] | None = None) -> None:
    path = model / "config.pbtxt"
    text = re.sub(r"(?m)^name:.*", f'name: "{name}"', path.read_text())
    if max_batch_size is not None:
        text = re.sub(r"(?m)^max_batch_size:.*", f"max_batch_size: {max_batch_size}", text)
    if replace is not None:
        text = text.replace(*replace)
    path.write_text(text + append)


def generated(qa: Path, unit: Path, script: str, *flags: str) -> Path:
    """The models one of qa/common's generators writes (with its --onnx paths), generated once per work folder."""
    out = unit.parent / "_generated" / f"{Path(script).stem}{''.join(flags)}"
    if not out.is_dir():
        partial = out.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        subprocess.run([sys.executable, script, "--models_dir", str(partial), *flags], cwd=qa / "common", check=True, capture_output=True)
        partial.rename(out)
    return out


# -- servers ------------------------------------------------------------------------------------------------
def _server_command(server: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if server == "nereid":
        return [str(Path(sys.executable).parent / "nereid"), "serve", *args], env
    sys.path.insert(0, str(ROOT))
    from tests.reference_triton import require

    reference = require()
    env.update(reference.environment())
    return reference.command(*args), env


def _wait_ready(process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/live", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server was not live in time")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- unittest's verbose report ------------------------------------------------------------------------------
_VERDICT = re.compile(r"^(test\w*) \([\w.]+\)\n?(?:.*\n)*?.*? \.\.\. (ok|FAIL|ERROR|skipped '(.*)'|expected failure|unexpected success)$", re.M)
_DETAIL = re.compile(r"^(?:FAIL|ERROR): (test\w*) \([\w.]+\)\n(?:.*\n)?-{10,}\n((?:.*\n)*?)(?=^={10,}|^-{10,}\nRan )", re.M)


def parse_unittest(report: str) -> list[Case]:
    reasons = {}
    for match in _DETAIL.finditer(report):
        lines = [line for line in match.group(2).strip().splitlines() if line.strip()]
        reasons[match.group(1)] = lines[-1].strip() if lines else ""
    cases = []
    for match in _VERDICT.finditer(report):
        name, verdict = match.group(1), match.group(2)
        if verdict in ("ok", "expected failure"):
            cases.append(Case(name, "passed"))
        elif verdict.startswith("skipped"):
            cases.append(Case(name, "skipped", match.group(3) or ""))
        else:
            cases.append(Case(name, "failed", reasons.get(name, verdict)))
    return cases


_PYTEST_VERDICT = re.compile(r"^\S+::(test\w*) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", re.M)
_PYTEST_REASON = re.compile(r"^(?:FAILED|ERROR) \S+::(test\w*) - (.*)$", re.M)


def parse_pytest(report: str) -> list[Case]:
    """pytest's `-v -rfE` report: one line per case, and the summary's one-line reasons."""
    reasons = {m.group(1): m.group(2) for m in _PYTEST_REASON.finditer(report)}
    outcome = {"PASSED": "passed", "XFAIL": "passed", "SKIPPED": "skipped"}
    return [Case(m.group(1), outcome.get(m.group(2), "failed"), reasons.get(m.group(1), m.group(2))) if outcome.get(m.group(2)) != "passed"
            else Case(m.group(1), "passed") for m in _PYTEST_VERDICT.finditer(report)]  # fmt: skip


def run_unit(unit: Unit, qa: Path, work: Path, server: str, python: str) -> list[tuple[Run, list[Case]]]:
    unit_dir = work / unit.folder
    results = []
    for run in unit.runs:
        unit.build(unit_dir, qa)
        log_path = unit_dir / run.server_log
        # `{unit}` in a server argument or an environment value stands for the unit's folder (test.sh's `pwd`).
        command, env = _server_command(server, [a.replace("{unit}", str(unit_dir)) for a in run.server_args])
        env.update({k: v.replace("{unit}", str(unit_dir)) for k, v in run.env.items()}, MODEL_LOG_DIR=str(unit_dir), PYTHONDONTWRITEBYTECODE="True")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, cwd=unit_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        cases: list[Case] = []
        if run.refuses_to_start:
            results.append((run, [_refused(process, log_path, run.refuses_to_start)]))
            continue
        env["SERVER_PID"] = str(process.pid)  # as test.sh exports it, for the tests that watch the server
        try:
            _wait_ready(process, 120)
            for body in run.log_settings:
                cases.append(_post_log_settings(body))
            for test in run.tests:
                started = time.monotonic()
                file, *selection = shlex.split(test)
                # "pytest file.py": a file of pytest-style tests (no unittest main), run as test.sh runs it.
                pytest = file == "pytest"
                if pytest:
                    file, *selection = selection
                argv = [python, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", file, *selection] if pytest else [python, file, *selection, "-v"]
                done = subprocess.run(argv, cwd=unit_dir, env=env, capture_output=True, text=True)
                stem = "_".join([Path(file).stem, *selection])[:100]
                (unit_dir / f"{stem}.{run.name.replace(' ', '_')}.client.log").write_text(done.stdout + done.stderr)
                found = parse_pytest(done.stdout) if pytest else parse_unittest(done.stderr)
                if not found:
                    found = [Case(test, "failed", f"no unittest report (exit {done.returncode}); see the client log")]
                cases += found
                print(f"  {unit.folder} [{run.name}] {test}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        except RuntimeError as exc:
            cases.append(Case("server start", "failed", str(exc)))
        finally:
            _stop(process)
        text = log_path.read_text(errors="replace")
        for needle in run.absent_from_log:
            found_it = needle in text
            cases.append(Case(f"log has no '{needle}'", "failed" if found_it else "passed", "found" if found_it else ""))
        for needle, count in run.log_counts.items():
            found = sum(1 for line in text.splitlines() if needle in line)
            cases.append(Case(f"log has {count} lines with '{needle}'", "passed" if found == count else "failed", "" if found == count else f"{found} lines"))
        for needle in run.present_in_log:
            missing = needle not in text
            cases.append(Case(f"log has '{needle}'", "failed" if missing else "passed", "missing" if missing else ""))
        results.append((run, cases))
    return results


def _post_log_settings(body: dict[str, object]) -> Case:
    name = f"POST /v2/logging {json.dumps(body)}"
    request = urllib.request.Request("http://127.0.0.1:8000/v2/logging", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return Case(name, "passed" if reply.status == 200 else "failed", "" if reply.status == 200 else str(reply.status))
    except OSError as exc:
        return Case(name, "failed", str(exc))


def _refused(process: subprocess.Popen[bytes], log_path: Path, message: str) -> Case:
    name = f"server refuses to start: '{message}'"
    try:
        _wait_ready(process, 60)
        _stop(process)
        return Case(name, "failed", "the server started")
    except RuntimeError:
        if process.poll() is None:
            _stop(process)
            return Case(name, "failed", "the server neither started nor exited")
    if process.returncode == 0:
        return Case(name, "failed", "the server exited with 0")
    if message not in log_path.read_text(errors="replace"):
        return Case(name, "failed", f"exit {process.returncode}, the message is not in the log")
    return Case(name, "passed")


def _prepare_work(qa: Path, work: Path, units: list[Unit]) -> None:
    """The units' folders copied (their test files untouched), with common/ and python_models/ beside them."""
    work.mkdir(parents=True, exist_ok=True)
    for shared in ("common", "python_models"):
        if not (work / shared).exists():
            (work / shared).symlink_to(qa / shared)
    for unit in units:
        target = work / unit.folder
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(qa / unit.folder, target, ignore=shutil.ignore_patterns("models"))
        # A subtest's helpers one level up (L0_backend_python/common.sh and the like).
        parent = (qa / unit.folder).parent
        if parent != qa:
            for item in parent.iterdir():
                if item.is_file() and not (target.parent / item.name).exists():
                    shutil.copy(item, target.parent / item.name)


def _short(reason: str, limit: int = 240) -> str:
    reason = reason.replace("|", "/").replace("\n", " ")
    return reason if len(reason) <= limit else reason[:limit] + " …"


def report(server: str, unit: Unit, results: list[tuple[Run, list[Case]]]) -> str:
    lines = [f"### {unit.folder} against {server}", ""]
    if unit.note:
        lines += [f"Not run: {unit.note}.", ""]
    lines += ["| run | cases | passed | failed | not run |", "|---|---|---|---|---|"]
    for run, cases in results:
        count = {o: sum(1 for c in cases if c.outcome == o) for o in ("passed", "failed", "skipped")}
        lines.append(f"| {run.name} | {len(cases)} | {count['passed']} | {count['failed']} | {count['skipped']} |")
    details = [(run, c) for run, cases in results for c in cases if c.outcome != "passed"]
    if details:
        lines += ["", "| run | case | outcome | reason |", "|---|---|---|---|"]
        lines += [f"| {run.name} | `{c.name}` | {c.outcome} | {_short(c.reason)} |" for run, c in details]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.triton_qa.units import UNITS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa", type=Path, required=True, help="a local copy of Triton's qa/ folder")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nereid-triton-qa"), help="where the units run")
    parser.add_argument("--server", choices=("nereid", "triton"), default="nereid")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the test files run with")
    parser.add_argument("--runs", default="", help="only the server starts whose name matches this regular expression")
    parser.add_argument("units", nargs="*", default=list(UNITS), help=f"units to run (default: {', '.join(UNITS)})")
    args = parser.parse_args(argv)
    units = [UNITS[name] for name in args.units]
    if args.runs:  # a part of a long unit, e.g. one model repository's starts
        units = [replace(u, runs=[r for r in u.runs if re.search(args.runs, r.name)]) for u in units]
    if args.server == "triton":
        units = [u for u in units if u.python_models_only]
    _prepare_work(args.qa.resolve(), args.work.resolve(), units)
    failed = False
    for unit in units:
        results = run_unit(unit, args.qa.resolve(), args.work.resolve(), args.server, args.python)
        print(report(args.server, unit, results))
        failed |= any(c.outcome == "failed" for _, cases in results for c in cases)
    return 1 if failed else 0


