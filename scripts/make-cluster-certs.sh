#!/usr/bin/env bash
# Makes the TLS material of a Fucina cluster with openssl: one cluster CA, and certificates that
# a coordinator or worker uses both to serve and to dial the other processes of the cluster.
#
#   scripts/make-cluster-certs.sh [--name NAME] [--days N] DIR [SAN ...]
#
#   DIR/ca.crt, DIR/ca.key      the cluster CA (EC P-256), made on first use and reused after:
#                               run the script again with another --name for each machine.
#                               Keep ca.key away from the cluster once the certificates exist.
#   DIR/NAME.crt, DIR/NAME.key  a certificate signed by that CA (NAME defaults to "node"), valid
#                               for TLS servers and clients, for the subject alternative names
#                               given: IP addresses or DNS names (default: localhost 127.0.0.1).
#
# List every name or address this process is dialled at: a worker's --advertise host, the
# coordinator's host as workers' --coordinator names it. Then, on each machine:
#   fucina coordinator MODEL --tls-cert DIR/node.crt --tls-key DIR/node.key --tls-ca DIR/ca.crt
#   fucina worker --coordinator HOST:PORT --tls-cert DIR/node.crt --tls-key DIR/node.key \
#       --tls-ca DIR/ca.crt
#   fucina client generate --addr HOST:PORT --tls-ca DIR/ca.crt --prompt ...
# Any certificate this CA signs joins the cluster (with the join token): use a CA of its own for
# each cluster.
set -euo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

name=node
days=825
while [ $# -gt 0 ]; do
  case "$1" in
    --name) [ $# -ge 2 ] || usage; name="$2"; shift 2 ;;
    --days) [ $# -ge 2 ] || usage; days="$2"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "make-cluster-certs: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
dir="$1"; shift
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "make-cluster-certs: --name must be [A-Za-z0-9._-]+" >&2; exit 2; }
[[ "$days" =~ ^[0-9]+$ ]] && [ "$days" -ge 1 ] || { echo "make-cluster-certs: --days must be a positive integer" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-cluster-certs: openssl not found (apt-get install openssl)" >&2; exit 1; }
[ $# -gt 0 ] || set -- localhost 127.0.0.1

sans=()
for san in "$@"; do
  if [[ "$san" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$san" == *:* ]]; then
    sans+=("IP:$san")
  elif [[ "$san" =~ ^[A-Za-z0-9*]([A-Za-z0-9.*-]*[A-Za-z0-9])?$ ]]; then
    sans+=("DNS:$san")
  else
    echo "make-cluster-certs: '$san' is neither an IP address nor a DNS name" >&2
    exit 2
  fi
done
san_list="$(IFS=,; echo "${sans[*]}")"

umask 077
mkdir -p "$dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/openssl.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[node_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = $san_list
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF

if [ ! -s "$dir/ca.crt" ] || [ ! -s "$dir/ca.key" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" 2>/dev/null
  openssl req -x509 -new -config "$work/openssl.cnf" -extensions ca_ext -key "$dir/ca.key" \
    -subj "/CN=Fucina cluster CA" -days 3650 -out "$dir/ca.crt"
  echo "make-cluster-certs: made the cluster CA $dir/ca.crt" >&2
fi
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/node.key" 2>/dev/null
openssl req -new -config "$work/openssl.cnf" -key "$work/node.key" -subj "/CN=$name" \
  -out "$work/node.csr"
openssl x509 -req -in "$work/node.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$work/openssl.cnf" \
  -extensions node_ext -out "$work/node.crt" 2>/dev/null
mv "$work/node.key" "$dir/$name.key"
mv "$work/node.crt" "$dir/$name.crt"
chmod 644 "$dir/ca.crt" "$dir/$name.crt"
echo "make-cluster-certs: made $dir/$name.crt ($san_list)" >&2
