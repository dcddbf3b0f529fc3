#!/usr/bin/env bash
# Makes the secrets deploy/docker-compose.yml mounts, with openssl alone:
#
#   ca.pem                      the cluster's CA; its key goes to DIR-ca/ca-key.pem,
#                               outside what the containers mount: keep it offline
#   n1.pem, n1-key.pem, ...     one certificate per node, for its API (TLS) and for Raft
#                               (mutual TLS): SANs n1, localhost and 127.0.0.1, server
#                               and client auth, and the URI SAN idemkv://node/n1 that
#                               binds it to its node id
#   tokens.yaml                 the --auth-file: hashes only
#   admin-token, client-token,  the tokens themselves; admin-token is also the
#   monitor-token               --join-token-file of joining nodes
#
#   deploy/gen-secrets.sh [DIR]           (default deploy/secrets)
#   IDEMKV_TENANT=acme deploy/gen-secrets.sh   the client token's tenant (default demo)
#
# The containers run as uid 65532, so the files are made readable by all. On a shared
# host, chown the directory to 65532 and make it 0700 instead.
set -euo pipefail

out="${1:-$(dirname "$0")/secrets}"
tenant="${IDEMKV_TENANT:-demo}"
days=825
mkdir -p "$out" "$out-ca"
chmod 0700 "$out-ca"
cakey="$(cd "$out-ca" && pwd)/ca-key.pem"
cd "$out"
if [ -e tokens.yaml ] || [ -e "$cakey" ]; then
	echo "$out already holds secrets; remove them (and $out-ca) first" >&2
	exit 1
fi

ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -days "$days" -subj "/CN=idemkv cluster CA" \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
	-keyout "$cakey" -out ca.pem 2>/dev/null
for n in n1 n2 n3; do
	openssl req "${ec[@]}" -subj "/CN=$n" -keyout "$n-key.pem" -out "$n.csr" 2>/dev/null
	printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1,URI:idemkv://node/%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "$n" "$n" >"$n.ext"
	openssl x509 -req -in "$n.csr" -CA ca.pem -CAkey "$cakey" -CAcreateserial -days "$days" \
		-extfile "$n.ext" -out "$n.pem" 2>/dev/null
	rm "$n.csr" "$n.ext"
done
rm -f ca.srl

token() { printf 'idk_%s' "$(openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n')"; }
hash() { printf 'sha256:%s' "$(printf '%s' "$1" | openssl dgst -sha256 -r | cut -d' ' -f1)"; }
admin="$(token)"
client="$(token)"
monitor="$(token)"
printf '%s\n' "$admin" >admin-token
printf '%s\n' "$client" >client-token
printf '%s\n' "$monitor" >monitor-token
cat >tokens.yaml <<YAML
# idemkv --auth-file: token hashes, roles and tenants. Rotate a token by replacing its
# hash and sending the nodes SIGHUP.
tokens:
  - name: admin
    hash: $(hash "$admin")
    role: admin
    tenants: ["*"]
  - name: ${tenant}-client
    hash: $(hash "$client")
    role: client
    tenants: [${tenant}]
  - name: monitor
    hash: $(hash "$monitor")
    role: monitor
YAML
chmod 0644 ./*
chmod 0755 .
chmod 0600 "$cakey"
echo "secrets written to $out, the CA key to $cakey"
