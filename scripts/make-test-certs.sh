#!/usr/bin/env bash
# Makes, in DIR, what a TLS or mTLS test of a client needs, with fresh P-256 keys valid for one day:
#
#   ca.pem                      the CA that signs rota's certificate (the clients' tls_ca)
#   server.pem, server.key      rota's certificate for 127.0.0.1, ::1 and localhost (--tls-cert/--tls-key)
#   client-ca.pem               a second CA, for rota's --tls-client-ca
#   client.pem, client.key      a client certificate signed by client-ca.pem
#   other.pem, other.key        a client certificate from a CA rota does not trust
#
#   scripts/make-test-certs.sh DIR
#
# Keys are PKCS#8 PEM. Needs the openssl command (scripts/install-openssl.sh).
set -euo pipefail
dir="${1:?usage: make-test-certs.sh DIR}"
mkdir -p "$dir"
cd "$dir"

ca() { # NAME: NAME.pem and NAME.key, a self-signed CA
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -keyout "$1.key" -out "$1.pem" -subj "/CN=rota test $1" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}

leaf() { # NAME CA EXTENSIONS: NAME.pem and NAME.key, signed by CA
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=rota test $1" 2>/dev/null
  printf '%b\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca
ca client-ca
ca other-ca
leaf server ca 'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth'
leaf client client-ca 'extendedKeyUsage=clientAuth'
leaf other other-ca 'extendedKeyUsage=clientAuth'
rm -f ./*.srl
