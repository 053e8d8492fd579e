#!/bin/sh
# Install Nereid into a virtual environment: the recipe of the container image, run by CI as well so it cannot rot.
#
#   install.sh [--venv DIR] [--extras s3,redis,...] [--torch-index-url URL] [--dry-run] [--check] SOURCE_DIR
#
# --extras         optional dependency groups of pyproject.toml (each is checked against it; a typo fails)
# --torch-index-url where the pytorch/llm extras take torch from (the CPU wheels by default: no CUDA download)
# --dry-run        resolve every requirement against the index and write DIR/install-report.json; install nothing
# --check          after installing: import Nereid and each extra's library, then start `nereid serve` on an
#                  empty repository on loopback and wait for /v2/health/ready, then stop it with SIGTERM
set -eu

VENV=/opt/nereid
EXTRAS=""
TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
DRY_RUN=0
CHECK=0
PYTHON="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV="$2"; shift 2 ;;
        --extras) EXTRAS="$2"; shift 2 ;;
        --torch-index-url) TORCH_INDEX_URL="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --check) CHECK=1; shift ;;
        -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -eq 1 ] || { echo "usage: install.sh [--venv DIR] [--extras LIST] [--dry-run] [--check] SOURCE_DIR" >&2; exit 2; }
SOURCE="$(cd "$1" && pwd)"
[ -f "$SOURCE/pyproject.toml" ] || { echo "install.sh: $SOURCE has no pyproject.toml" >&2; exit 2; }

# Every extra asked for must exist: a misspelt one would otherwise install nothing, silently.
EXTRAS="$(echo "$EXTRAS" | tr -d ' ')"
"$PYTHON" - "$SOURCE/pyproject.toml" "$EXTRAS" <<'PY'
import sys, tomllib
known = tomllib.load(open(sys.argv[1], "rb"))["project"].get("optional-dependencies", {})
unknown = [e for e in sys.argv[2].split(",") if e and e not in known]
if unknown:
    sys.exit(f"install.sh: unknown extra(s) {', '.join(unknown)}; pyproject.toml has: {', '.join(sorted(known))}")
PY

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
TARGET="$SOURCE"
[ -z "$EXTRAS" ] || TARGET="$SOURCE[$EXTRAS]"
set -- --no-cache-dir --disable-pip-version-check
case ",$EXTRAS," in
    *,pytorch,*|*,llm,*) set -- "$@" --extra-index-url "$TORCH_INDEX_URL" ;;
esac
if [ "$DRY_RUN" = 1 ]; then
    "$VENV/bin/pip" install "$@" --quiet --dry-run --ignore-installed --report "$VENV/install-report.json" "$TARGET"
    "$PYTHON" -c 'import json, sys; print("install.sh: resolved %d packages into %s" % (len(json.load(open(sys.argv[1]))["install"]), sys.argv[1]))' "$VENV/install-report.json"
    exit 0
fi
# A regular (not editable) install: the image needs the package, not the source tree.
"$VENV/bin/pip" install "$@" --quiet "$TARGET"

if [ "$CHECK" = 1 ]; then
    "$VENV/bin/nereid" serve --help >/dev/null
    "$VENV/bin/python" - "$EXTRAS" <<'PY'
import importlib, os, signal, socket, subprocess, sys, tempfile, time, urllib.request

libraries = {"s3": ["boto3"], "gcs": ["google.cloud.storage"], "azure": ["azure.storage.blob"], "redis": ["redis"],
             "pytorch": ["torch"], "fil": ["xgboost", "lightgbm", "sklearn"],
             "openvino": ["openvino"], "analyze": ["matplotlib"], "gpu": ["pynvml"], "llm": ["transformers"]}
import nereid
for extra in filter(None, sys.argv[1].split(",")):
    for name in libraries.get(extra, []):
        importlib.import_module(name)

def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

http, grpc, metrics = port(), port(), port()
with tempfile.TemporaryDirectory() as repository:
    server = subprocess.Popen([os.path.join(sys.prefix, "bin", "nereid"), "serve", "--model-repository", repository,
                               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"])
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"install.sh: nereid serve did not become ready (exit status {server.poll()})")
            time.sleep(0.2)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
    if server.wait(60) != 0:
        sys.exit(f"install.sh: nereid serve exited with {server.returncode} on SIGTERM")
print(f"install.sh: nereid {getattr(nereid, '__version__', '')} installed in {sys.prefix} and served", flush=True)
PY
fi
