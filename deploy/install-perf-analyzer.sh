#!/usr/bin/env bash
# install-perf-analyzer.sh [DIR] -- install Triton's perf_analyzer (PyPI perf-analyzer 2.60.0) into
# DIR (default ~/.cache/tritonactor/perf-analyzer) for tests/e2e/test_perf_analyzer_e2e.py and
# bench/, and print the path of a runnable wrapper. Its wheel is built for glibc >= 2.38 (pip on
# an older system skips it and picks a placeholder): it is fetched for that platform tag, and on
# an older glibc the wrapper runs the binary under Debian 13's libc6, libstdc++6 and libgcc-s1,
# unpacked into DIR (nothing installed system-wide). Safe to run again: what is there is kept.
set -euo pipefail
D=${1:-$HOME/.cache/tritonactor/perf-analyzer}
mkdir -p "$D/bin"
# shellcheck source=deploy/trixie-download.sh
. "$(dirname "$0")/trixie-download.sh"
if [ ! -x "$D/pa/perf_analyzer/bin/perf_analyzer" ]; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --upgrade \
    --platform manylinux_2_38_x86_64 --target "$D/pa" perf-analyzer==2.60.0 >&2
fi
glibc=$(ldd --version 2>/dev/null | awk 'NR == 1 {print $NF}')
older=$(printf '%s\n' 2.38 "$glibc" | sort -V | head -1)
if [ "$older" != 2.38 ] && [ ! -e "$D/libs/usr/lib/x86_64-linux-gnu/libc.so.6" ]; then
  W=$(mktemp -d "${TMPDIR:-/tmp}/tritonactor-perf-analyzer.XXXXXX")
  trap 'rm -rf "$W"' EXIT
  trixie_download "$W" libc6 libstdc++6 libgcc-s1
  for package in "$W"/*.deb; do dpkg-deb -x "$package" "$D/libs"; done
fi
cat >"$D/bin/perf_analyzer" <<'WRAPPER'
#!/bin/sh
# perf_analyzer 2.60.0, under the newer C libraries beside it when the system's are too old.
D=$(cd "$(dirname "$0")/.." && pwd)
L=$D/libs/usr/lib/x86_64-linux-gnu
[ -e "$L/libc.so.6" ] || exec "$D/pa/perf_analyzer/bin/perf_analyzer" "$@"
exec "$L/ld-linux-x86-64.so.2" --library-path "$L:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" \
  "$D/pa/perf_analyzer/bin/perf_analyzer" "$@"
WRAPPER
chmod +x "$D/bin/perf_analyzer"
echo "$D/bin/perf_analyzer"
