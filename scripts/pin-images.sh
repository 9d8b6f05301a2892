#!/usr/bin/env bash
# Pin every image of deploy/images.lock by digest: read each tag's digest from its registry, then
# write it into the lock and into every place the image is named (compose.yaml, the Dockerfiles,
# deploy/k8s), as `tag@sha256:...`. Needs the registries (Docker Hub, nvcr.io) and `crane` or
# Docker's `buildx`. Review the change and commit it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

digest_of() {
  if command -v crane >/dev/null; then
    crane digest "$1"
  else
    docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' \
      | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["digest"])'
  fi
}

pins=()
while read -r image _; do
  case "$image" in '' | '#'*) continue ;; esac
  digest="$(digest_of "$image")"
  [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "pin-images: $image: no digest ($digest)" >&2; exit 1; }
  echo "$image $digest"
  pins+=("$image=$digest")
done <deploy/images.lock

"$PYTHON" - "${pins[@]}" <<'PY'
import re
import sys
from pathlib import Path

pins = dict(pin.split("=", 1) for pin in sys.argv[1:])
lock = Path("deploy/images.lock")
lines = []
for line in lock.read_text().splitlines():
    image = line.split()[0] if line.strip() and not line.startswith("#") else None
    lines.append(f"{image:<50}{pins[image]}" if image in pins else line)
lock.write_text("\n".join(lines) + "\n")
files = [Path("compose.yaml"), *Path("deploy").glob("**/*Dockerfile"), *Path("deploy/k8s").glob("*.yaml")]
for path in files:
    text = path.read_text()
    for image, digest in pins.items():
        reference = rf"(?<![\w./-]){re.escape(image)}(?:@sha256:[0-9a-f]{{64}})?(?![\w.-])"
        text = re.sub(reference, f"{image}@{digest}", text)
    path.write_text(text)
PY
echo "pin-images: pinned ${#pins[@]} images; review with git diff"
