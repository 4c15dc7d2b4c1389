#!/usr/bin/env bash
# Makes a development CA, one certificate for every Fulcrum process (server
# and client use: mTLS) and two tokens, in DIR (default ~/.fulcrum/local/tls):
#   ca.crt ca.key           the CA
#   node.crt node.key       signed by it; SANs: localhost, 127.0.0.1 and any
#                           names or IPs given after DIR (e.g. pod DNS names)
#   cluster-token           the cluster credential (--cluster-token-file)
#   token                   the JobService token (scheduler --token-file;
#                           clients: fulcrum --token "$(cat token)")
# `fulcrum local up --tls --dir D` uses D/tls, making it with this script's
# logic if it is missing. For development only: keys are unencrypted.
set -euo pipefail
dir="${1:-$HOME/.fulcrum/local/tls}"
shift || true
command -v openssl >/dev/null || { echo "dev-certs.sh: openssl is needed (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ ]]; then san="$san,IP:$name"; else san="$san,DNS:$name"; fi
done
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=fulcrum-dev-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=fulcrum-node" -keyout node.key -out node.csr 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$san" > node.ext
openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
  -extfile node.ext -out node.crt 2>/dev/null
rm -f node.csr node.ext ca.srl
openssl rand -hex 24 > cluster-token
openssl rand -hex 24 > token
chmod 600 ca.key node.key cluster-token token
echo "dev-certs.sh: CA, node certificate (SAN $san) and tokens in $dir"
