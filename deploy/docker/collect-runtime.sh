#!/usr/bin/env bash
# Lays out what the runtime image holds, from a `fucina` binary built on Debian 12:
#
#   deploy/docker/collect-runtime.sh BIN DIST
#
#   DIST/bin/fucina              the binary
#   DIST/lib/*.so*               every shared library it loads, but glibc's (the base image has
#                                the same glibc; its loader must match it)
#   DIST/ca-certificates.crt     the CA bundle libcurl reads (fucina pull over https)
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
bin="$1"
dist="$2"
[ -x "$bin" ] || { echo "collect-runtime: $bin is not an executable" >&2; exit 1; }
bundle=/etc/ssl/certs/ca-certificates.crt
[ -s "$bundle" ] || { echo "collect-runtime: $bundle missing (apt-get install ca-certificates)" >&2; exit 1; }
rm -rf "$dist"
mkdir -p "$dist/bin" "$dist/lib"
cp "$bin" "$dist/bin/fucina"
cp "$bundle" "$dist/ca-certificates.crt"
# ldd prints `name => path (address)`; a library it cannot find is an error here, not in a pod.
if ldd "$bin" | grep -q "not found"; then
  echo "collect-runtime: unresolved libraries:" >&2
  ldd "$bin" | grep "not found" >&2
  exit 1
fi
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*) ;;
    *) cp -L "$lib" "$dist/lib/" ;;
  esac
done
echo "collect-runtime: $(ls "$dist/lib" | wc -l) libraries, $(du -sh "$dist" | cut -f1) in $dist"
