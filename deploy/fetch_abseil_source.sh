#!/usr/bin/env bash
# Fetches the source of the abseil that Debian ships (the same version as libabsl-dev) into
# /opt/spex/abseil-src, for --config=tsan only: ThreadSanitizer sees absl::Mutex's
# synchronisation only when abseil itself is compiled with -fsanitize=thread, and Debian's
# prebuilt libabsl is not. Bazel compiles it (third_party/absl_src.BUILD) under --config=tsan;
# every other configuration links Debian's libabsl. Idempotent: returns at once when present.
#   bash deploy/fetch_abseil_source.sh [DEST]
set -euo pipefail
DEST=${1:-/opt/spex/abseil-src}
VERSION=$(dpkg-query -W -f='${Version}' libabsl-dev)
if [ -f "$DEST/.spex-version" ] && [ "$(cat "$DEST/.spex-version")" = "$VERSION" ]; then
  exit 0
fi
work=$(mktemp -d /tmp/spex-abseil.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A private sources list and list directory: the machine's own apt configuration is not touched.
mkdir -p "$work/lists/partial"
cat >"$work/sources.list" <<LIST
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
LIST
APT=(apt-get -qq -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
"${APT[@]}" update
(cd "$work" && "${APT[@]}" source --download-only "abseil=$VERSION")
orig=$(ls "$work"/abseil_*.orig.tar.gz 2>/dev/null | head -1)
debian=$(ls "$work"/abseil_*.debian.tar.xz 2>/dev/null | head -1)
if [ -z "$orig" ] || [ -z "$debian" ]; then
  echo "fetch_abseil_source: could not download the source of abseil $VERSION from Debian" >&2
  exit 1
fi
mkdir -p "$work/src"
tar -xzf "$orig" -C "$work/src" --strip-components=1
# Debian's patches (its security fixes among them), in Debian's order.
tar -xJf "$debian" -C "$work/src"
while read -r p; do
  case $p in '' | '#'*) continue ;; esac
  patch -d "$work/src" -p1 -s --forward <"$work/src/debian/patches/$p"
done <"$work/src/debian/patches/series"
# Debian's own build options (std types off, hardened on), in an inline namespace of our own,
# so the instrumented copy never shares a symbol with Debian's libabsl that gRPC links.
sed 's/^#define ABSL_OPTION_INLINE_NAMESPACE_NAME .*/#define ABSL_OPTION_INLINE_NAMESPACE_NAME spex_tsan/' \
  /usr/include/absl/base/options.h >"$work/src/absl/base/options.h"
# Bazel reads the tree through third_party/absl_src.BUILD alone: abseil's own BUILD files would
# cut it into packages.
find "$work/src" \( -name BUILD.bazel -o -name BUILD -o -name WORKSPACE \) -delete
echo "$VERSION" >"$work/src/.spex-version"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$work/src" "$DEST"
echo "fetch_abseil_source: abseil $VERSION source in $DEST"
