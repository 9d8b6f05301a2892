#!/usr/bin/env bash
# Write uv.lock from pyproject.toml: run after changing a dependency, then commit uv.lock. Every
# install (scripts/install.sh, so `make` and CI, and every image) installs exactly what it records.
#
# Where PyTorch's CPU index is reachable this is plain `uv lock`. Where it is not (machines that
# get torch's CPU wheel from a local folder configured for pip as find-links, as
# scripts/install.sh does), the lock is resolved against a one-package index made of that folder's
# torch CPU wheels, and torch is then recorded as PyTorch's CPU index serves it: same file name
# under the index's URL, the hash of the file at hand. An install from PyTorch's index checks that
# hash, so a wheel there that differs fails the install instead of entering it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
INDEX="$("$PYTHON" -c 'import tomllib; print(next(i["url"] for i in tomllib.load(open("pyproject.toml", "rb"))["tool"]["uv"]["index"] if i["name"] == "pytorch-cpu"))')"

if curl -fsS -o /dev/null --max-time 10 "$INDEX/torch/" 2>/dev/null; then
  exec uv lock "$@"
fi

links="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$("$PYTHON" -m pip config get global.find-links 2>/dev/null || true)}}"
wheels=()
for dir in $links; do
  for wheel in "${dir#file://}"/torch-*+cpu-*.whl; do [ -f "$wheel" ] && wheels+=("$wheel"); done
done
[ "${#wheels[@]}" -gt 0 ] || {
  echo "lock: $INDEX is not reachable and no find-links folder holds a torch CPU wheel" >&2
  exit 1
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/index/torch" "$work/project"
for wheel in "${wheels[@]}"; do
  ln -s "$wheel" "$work/index/"
  name="$(basename "$wheel")"
  printf '<a href="../%s#sha256=%s">%s</a>\n' "${name//+/%2B}" "$(sha256sum "$wheel" | cut -d' ' -f1)" "$name"
done >"$work/index/torch/index.html"
cp pyproject.toml README.md "$work/project/"
if [ -f uv.lock ]; then cp uv.lock "$work/project/"; fi  # unchanged packages stay as they are
sed -i "s|^url = \"$INDEX\"\$|url = \"file://$work/index\"|" "$work/project/pyproject.toml"
(cd "$work/project" && uv lock "$@")

"$PYTHON" - "$work/project/uv.lock" "$work/index" "$INDEX" <<'EOF'
import re
import sys
from pathlib import Path
from urllib.parse import quote

lock, local, index = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = lock.read_text().replace(f'registry = "{local}"', f'registry = "{index}"')
text = text.replace(f'index = "file://{local}"', f'index = "{index}"')
text = re.sub(
    rf'\{{ path = "{re.escape(local)}/([^"]+)"',
    lambda wheel: f'{{ url = "{index}/{quote(wheel[1])}"',
    text,
)
assert local not in text, "the local index is still named in the lock"
Path("uv.lock").write_text(text)
EOF
echo "lock: wrote uv.lock (torch's CPU build from ${wheels[*]}; recorded as served by $INDEX)"
