#!/bin/sh
# Make the job's credentials with openssl: a CA, the coordinators' server
# certificate (for every name clients dial), a client certificate for mutual
# TLS, and a bearer token.
#
#   deploy/make-certs.sh DIR NAME [NAME ...]
#
# NAMEs are DNS names or IP addresses, e.g. coord-a.example.internal 10.0.0.5,
# or on Kubernetes fthsdp-coordinator fthsdp-coordinator.fthsdp.svc. Writes
# DIR/ca.crt, ca.key, coordinator.crt, coordinator.key, client.crt,
# client.key and token; keep ca.key offline. DAYS (default 365) sets the
# validity of the two certificates.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 DIR NAME [NAME ...]  (NAME: a DNS name or IP address clients use for the coordinator)" >&2
    exit 2
fi
dir=$1
shift
days=${DAYS:-365}
umask 077
mkdir -p "$dir"
cd "$dir"

sans=""
for name in "$@"; do
    case $name in
        *[!0-9.]*) case $name in *:*) kind=IP ;; *) kind=DNS ;; esac ;;
        *) kind=IP ;;
    esac
    sans="${sans:+$sans,}$kind:$name"
done

# The CA (ten years; it only signs).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout ca.key -out ca.crt -days 3650 -subj "/CN=fthsdp CA" 2>/dev/null

# $1 name, $2 subject, $3 extensions
sign() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf '%s\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
        -out "$1.crt" -days "$days" -extfile "$1.ext" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
sign coordinator "/CN=fthsdp coordinator" \
    "basicConstraints=CA:FALSE
keyUsage=digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$sans"
sign client "/CN=fthsdp client" \
    "basicConstraints=CA:FALSE
keyUsage=digitalSignature
extendedKeyUsage=clientAuth"
rm -f ca.srl

openssl rand -hex 32 > token
echo "wrote $dir: ca.crt ca.key coordinator.crt coordinator.key client.crt client.key token (for $sans)"
