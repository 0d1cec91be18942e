#!/usr/bin/env bash
# deploy/gen-certs.sh: a private CA and the certificates a Strata fleet (or a test) needs,
# made with the openssl command line only.
#
#   DIR/ca.pem, DIR/ca.key            the CA (basicConstraints CA:true, keyCertSign)
#   DIR/server.pem, DIR/server.key    the server (serverAuth; SANs from --server)
#   DIR/agents/HOST.pem, .key         one per agent (clientAuth; CN and SAN DNS = HOST, the
#                                     agent's identity is its host name)
#   DIR/clients/NAME.pem, .key        operators and readers with client certificates
#                                     (clientAuth; CN and SAN DNS = NAME)
#   DIR/nodes/NAME.pem, .key          cluster nodes: each serves agents and calls the other
#                                     nodes with it (serverAuth and clientAuth; CN and first
#                                     SAN DNS = NAME, then the --node-address SANs)
#   DIR/expired/NAME.pem, .key        for tests: valid yesterday, expired now (clientAuth and
#                                     serverAuth)
#
# Idempotent: an existing CA is reused (new certificates are signed by it) and existing
# certificates are kept, unless --new-ca (a new CA; the server certificate and those named
# on this run are reissued) or --renew (the certificates named on this run, the server's
# only with --server, are reissued by the same CA).
# Files are written under a temporary name and renamed into place, so a server watching
# them (certificate rotation) never reads half a file. Private keys are mode 0600.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: deploy/gen-certs.sh --out DIR [options]
  --out DIR               where the CA and certificates go (created if missing)
  --ca-name NAME          the CA's subject CN (default: Strata CA)
  --days N                validity of new leaf certificates in days (default: 825)
  --ca-days N             validity of a new CA in days (default: 3650)
  --server NAME[,NAME...] DNS names and IP addresses of the server certificate; the first is
                          its CN (default: localhost,127.0.0.1)
  --agent HOST[,HOST...]  an agent certificate per host (repeatable)
  --client NAME[,NAME...] a client certificate per name (repeatable)
  --node NAME[,NAME...]   a cluster node certificate per name (repeatable); list it in the
                          tokens file as `cert NAME node`
  --node-address ADDR     a further DNS name or IP address in every node certificate issued
                          on this run (repeatable; e.g. 127.0.0.1 for a cluster on one machine)
  --expired NAME          an already expired certificate for tests (repeatable)
  --ca-only               only the CA
  --new-ca                replace an existing CA
  --renew                 reissue the certificates named on this run even if they exist
                          (the server's only if --server is given)
  --key-type ec|rsa       EC P-256 (default) or RSA 3072 keys for new certificates
  -h, --help              this text
EOF
}

die_usage() {
  echo "gen-certs: $*" >&2
  usage
  exit 2
}

out=""
ca_name="Strata CA"
days=825
ca_days=3650
server_names="localhost,127.0.0.1"
server_named=0
agents=()
clients=()
nodes=()
node_addresses=()
expired=()
ca_only=0
new_ca=0
renew=0
key_type=ec

need_value() {
  [[ $# -ge 2 && -n "$2" ]] || die_usage "$1 needs a value"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) need_value "$@"; out=$2; shift 2 ;;
    --ca-name) need_value "$@"; ca_name=$2; shift 2 ;;
    --days) need_value "$@"; days=$2; shift 2 ;;
    --ca-days) need_value "$@"; ca_days=$2; shift 2 ;;
    --server) need_value "$@"; server_names=$2; server_named=1; shift 2 ;;
    --agent) need_value "$@"; IFS=, read -r -a more <<<"$2"; agents+=("${more[@]}"); shift 2 ;;
    --client) need_value "$@"; IFS=, read -r -a more <<<"$2"; clients+=("${more[@]}"); shift 2 ;;
    --node) need_value "$@"; IFS=, read -r -a more <<<"$2"; nodes+=("${more[@]}"); shift 2 ;;
    --node-address) need_value "$@"; node_addresses+=("$2"); shift 2 ;;
    --expired) need_value "$@"; IFS=, read -r -a more <<<"$2"; expired+=("${more[@]}"); shift 2 ;;
    --ca-only) ca_only=1; shift ;;
    --new-ca) new_ca=1; shift ;;
    --renew) renew=1; shift ;;
    --key-type) need_value "$@"; key_type=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done

[[ -n "$out" ]] || die_usage "--out is required"
[[ "$days" =~ ^[1-9][0-9]{0,4}$ ]] || die_usage "--days must be a positive number of days"
[[ "$ca_days" =~ ^[1-9][0-9]{0,4}$ ]] || die_usage "--ca-days must be a positive number of days"
[[ "$key_type" == ec || "$key_type" == rsa ]] || die_usage "--key-type must be ec or rsa"
# The CA name goes into a subject: no '/', '=', '\' or control characters.
[[ -n "$ca_name" && "$ca_name" =~ ^[A-Za-z0-9\ ._-]+$ ]] ||
  die_usage "--ca-name may hold letters, digits, spaces, '.', '_' and '-'"

# Host and client names become file names and subjects: DNS-like names only (no '/', no
# leading dot, so nothing escapes DIR).
valid_name() {
  [[ "$1" =~ ^[A-Za-z0-9]([A-Za-z0-9._-]{0,252})$ ]]
}
is_ip() {
  [[ "$1" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || "$1" =~ ^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*$ ]]
}
IFS=, read -r -a servers <<<"$server_names"
[[ ${#servers[@]} -gt 0 ]] || die_usage "--server needs at least one name"
for n in "${servers[@]}"; do
  is_ip "$n" || valid_name "$n" || [[ "$n" =~ ^\*\.[A-Za-z0-9][A-Za-z0-9.-]*$ ]] ||
    die_usage "bad server name '$n'"
done
for n in "${node_addresses[@]}"; do
  is_ip "$n" || valid_name "$n" || die_usage "bad node address '$n'"
done
for n in "${agents[@]}" "${clients[@]}" "${nodes[@]}" "${expired[@]}"; do
  valid_name "$n" || die_usage "bad certificate name '$n' (letters, digits, '.', '_', '-')"
done

command -v openssl >/dev/null || { echo "gen-certs: openssl not found" >&2; exit 1; }

umask 077
mkdir -p "$out"
tmp=$(mktemp -d "$out/.gen-certs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Runs openssl quietly; on failure shows what it said and stops.
ossl() {
  if ! openssl "$@" >"$tmp/openssl.log" 2>&1; then
    echo "gen-certs: openssl $1 failed:" >&2
    cat "$tmp/openssl.log" >&2
    exit 1
  fi
}

# Writes a new private key to $1 (under a temporary name; renamed by install_pair).
new_key() {
  if [[ "$key_type" == ec ]]; then
    ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"
  else
    ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072 -out "$1"
  fi
}

key_usage() {
  # RSA key exchange (TLS 1.2) encrypts to the key; ECDSA keys only sign.
  if [[ "$key_type" == ec ]]; then echo "critical, digitalSignature"
  else echo "critical, digitalSignature, keyEncipherment"; fi
}

# Moves a finished key and certificate into place: the key first, each by rename.
install_pair() {  # tmpkey tmpcert dest-prefix
  chmod 600 "$1"
  chmod 644 "$2"
  mv -f "$1" "$3.key"
  mv -f "$2" "$3.pem"
}

# A random 127-bit serial in hex (positive: the top bit is clear).
serial_hex() {
  printf '%02x%s' $((RANDOM % 128)) "$(openssl rand -hex 15)"
}

# Extension section for a leaf certificate: $1 EKU, $2 subjectAltName.
leaf_ext() {
  cat <<EOF
[v3]
basicConstraints = critical, CA:FALSE
keyUsage = $(key_usage)
extendedKeyUsage = $1
subjectAltName = $2
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
EOF
}

# --- CA -----------------------------------------------------------------------------------
if [[ $new_ca == 1 || ! -s "$out/ca.pem" || ! -s "$out/ca.key" ]]; then
  if [[ -e "$out/ca.pem" || -e "$out/ca.key" ]] && [[ $new_ca == 0 ]]; then
    echo "gen-certs: $out has half a CA (ca.pem or ca.key missing); use --new-ca" >&2
    exit 1
  fi
  # Everything issued on this run is new, the server certificate included: it must chain to
  # the new CA.
  renew=1
  server_named=1
  cat >"$tmp/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = $ca_name
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
  new_key "$tmp/ca.key"
  ossl req -new -x509 -config "$tmp/ca.cnf" -key "$tmp/ca.key" -sha256 \
    -days "$ca_days" -set_serial "0x$(serial_hex)" -out "$tmp/ca.pem"
  install_pair "$tmp/ca.key" "$tmp/ca.pem" "$out/ca"
  echo "gen-certs: new CA $out/ca.pem (CN=$ca_name)"
  if compgen -G "$out/agents/*.pem" >/dev/null || compgen -G "$out/clients/*.pem" >/dev/null; then
    echo "gen-certs: note: certificates in $out not named on this run were issued by the old CA" >&2
  fi
else
  echo "gen-certs: reusing CA $out/ca.pem"
fi
if [[ $ca_only == 1 ]]; then exit 0; fi

# Issues `$dest.pem` and `.key` for CN=$2 with EKU $3 and SAN $4, unless it exists and $5
# (reissue) is 0.
issue() {  # dest cn eku san reissue
  local dest=$1 cn=$2 eku=$3 san=$4 reissue=$5 name
  name=$(basename "$dest")
  if [[ $reissue == 0 && -s "$dest.pem" && -s "$dest.key" ]]; then
    echo "gen-certs: keeping $dest.pem (--renew reissues it)"
    return
  fi
  mkdir -p "$(dirname "$dest")"
  new_key "$tmp/$name.key"
  ossl req -new -key "$tmp/$name.key" -subj "/CN=$cn" -out "$tmp/$name.csr"
  leaf_ext "$eku" "$san" >"$tmp/$name.ext"
  ossl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -set_serial "0x$(serial_hex)" -days "$days" -sha256 -extfile "$tmp/$name.ext" -extensions v3 \
    -out "$tmp/$name.pem"
  install_pair "$tmp/$name.key" "$tmp/$name.pem" "$dest"
  echo "gen-certs: issued $dest.pem (CN=$cn, $eku, $san)"
}

# An already expired certificate: `x509 -req` in OpenSSL 3.0 cannot backdate, `ca` can
# (-startdate/-enddate) with a throwaway database.
issue_expired() {  # dest cn
  local dest=$1 cn=$2 name db
  name=$(basename "$dest")
  if [[ $renew == 0 && -s "$dest.pem" && -s "$dest.key" ]]; then
    echo "gen-certs: keeping $dest.pem (--renew reissues it)"
    return
  fi
  mkdir -p "$(dirname "$dest")"
  db="$tmp/ca-db-$name"
  mkdir -p "$db"
  : >"$db/index.txt"
  serial_hex >"$db/serial"
  cat >"$db/ca.cnf" <<EOF
[ca]
default_ca = tmp_ca
[tmp_ca]
database = $db/index.txt
new_certs_dir = $db
serial = $db/serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
[policy_any]
commonName = supplied
$(leaf_ext "clientAuth, serverAuth" "DNS:$cn")
EOF
  new_key "$tmp/$name.key"
  ossl req -new -key "$tmp/$name.key" -subj "/CN=$cn" -out "$tmp/$name.csr"
  ossl ca -batch -config "$db/ca.cnf" -cert "$out/ca.pem" -keyfile "$out/ca.key" \
    -in "$tmp/$name.csr" -out "$tmp/$name.pem" -notext -extensions v3 \
    -startdate "$(date -u -d '2 days ago' +%Y%m%d%H%M%SZ)" \
    -enddate "$(date -u -d '1 day ago' +%Y%m%d%H%M%SZ)"
  install_pair "$tmp/$name.key" "$tmp/$name.pem" "$dest"
  echo "gen-certs: issued $dest.pem (CN=$cn, expired)"
}

san=""
for n in "${servers[@]}"; do
  if is_ip "$n"; then entry="IP:$n"; else entry="DNS:$n"; fi
  san="${san:+$san, }$entry"
done
# The server certificate counts as named on this run (for --renew) only with --server.
server_reissue=0
if [[ $renew == 1 && $server_named == 1 ]]; then server_reissue=1; fi
issue "$out/server" "${servers[0]}" serverAuth "$san" "$server_reissue"
for h in "${agents[@]}"; do issue "$out/agents/$h" "$h" clientAuth "DNS:$h" "$renew"; done
for c in "${clients[@]}"; do issue "$out/clients/$c" "$c" clientAuth "DNS:$c" "$renew"; done
for n in "${nodes[@]}"; do
  san="DNS:$n"
  for a in "${node_addresses[@]}"; do
    if is_ip "$a"; then san="$san, IP:$a"; else san="$san, DNS:$a"; fi
  done
  issue "$out/nodes/$n" "$n" "serverAuth, clientAuth" "$san" "$renew"
done
for e in "${expired[@]}"; do issue_expired "$out/expired/$e" "$e"; done
