"""The request fuzzers of tests/integration/test_fuzz_requests.py run against Nereid and real Triton side by side:
the same hypothesis-generated malformed v2 JSON and binary-extension bodies (plus the known nasty shapes) to the
Python add_sub model on each server, counting answers by class, 5xx that are not a well-formed JSON error,
hangs (no answer in 30 s) and crashes (the server process gone; it is restarted and the run goes on).

    .venv/bin/python benchmarks/fuzz_compare.py --examples 300
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.test_fuzz_requests import _NASTY_SHAPES, _doc, _json, _nasty_doc  # noqa: E402
from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

MODEL = "add_sub_python"


class _Target:
    def __init__(self, name: str, repo: Path) -> None:
        self.name, self.repo = name, repo
        self.counts: Counter[str] = Counter()
        self.errors_5xx: Counter[str] = Counter()  # the 5xx answers' messages, cut short
        self.server = self._start()
        self.session = requests.Session()

    def _start(self) -> RunningServer:
        return start_nereid(self.repo) if self.name == "nereid" else start_real_triton(self.repo)

    def send(self, body: bytes, headers: dict[str, str]) -> None:
        self.counts["cases"] += 1
        try:
            reply = self.session.post(f"{self.server.base}/v2/models/{MODEL}/infer", data=body, headers=headers, timeout=30)
        except requests.Timeout:
            self.counts["hangs"] += 1
            return
        except requests.RequestException:
            self.session = requests.Session()
            if self.server.process.poll() is not None:
                self.counts["crashes"] += 1
                self.server.stop()
                self.server = self._start()
            else:
                self.counts["connection errors"] += 1
            return
        self.counts[f"{reply.status_code // 100}xx"] += 1
        if reply.status_code >= 500:
            self.errors_5xx[f"{reply.status_code} {reply.text[:90]}"] += 1
            try:
                well_formed = isinstance(orjson.loads(reply.content).get("error"), str)
            except (orjson.JSONDecodeError, AttributeError):
                well_formed = False
            if not well_formed:
                self.counts["5xx not a JSON error"] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="hypothesis examples per body kind")
    args = parser.parse_args()
    if not reference_ready():
        print("real Triton is not on this machine")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        shutil.copytree(ROOT / "examples" / "model_repository" / MODEL, repo / MODEL)
        targets = [_Target("nereid", repo), _Target("triton", repo)]
        try:
            def both(body: bytes, headers: dict[str, str]) -> None:
                for target in targets:
                    target.send(body, headers)

            for shape in _NASTY_SHAPES:
                both(orjson.dumps(_nasty_doc(shape)), {"Content-Type": "application/json"})

            fuzz = settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)

            @fuzz
            @given(doc=st.one_of(_doc, _json))
            def json_bodies(doc: Any) -> None:
                both(orjson.dumps(doc), {"Content-Type": "application/json"})

            @fuzz
            @given(doc=_doc, binary=st.binary(max_size=300), header_length=st.one_of(st.none(), st.integers(-3, 2000)))
            def binary_bodies(doc: Any, binary: bytes, header_length: int | None) -> None:
                header = orjson.dumps(doc)
                length = str(len(header) if header_length is None else header_length)
                both(header + binary, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": length})

            json_bodies()
            binary_bodies()
        finally:
            for target in targets:
                target.server.stop()
    keys = ["cases", "2xx", "4xx", "5xx", "5xx not a JSON error", "hangs", "crashes", "connection errors"]
    print("| server | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for target in targets:
        print(f"| {target.name} | " + " | ".join(str(target.counts.get(k, 0)) for k in keys) + " |")
    for target in targets:
        for message, count in target.errors_5xx.most_common(5):
            print(f"{target.name}: {count} x {message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
