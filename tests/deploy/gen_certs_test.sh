#!/usr/bin/env bash
# gen_certs_test.sh PATH/TO/gen-certs.sh: the CA and certificates deploy/gen-certs.sh makes
# verify (or, the expired one, do not), carry the expected names and key usages, keep their
# keys private, and a second run reuses the CA and the certificates already made.
set -euo pipefail
script=${1:?usage: gen_certs_test.sh PATH/TO/gen-certs.sh}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_verify() {  # cafile cert purpose
  openssl verify -CAfile "$1" -purpose "$3" "$2" >/dev/null 2>&1 || fail "$2 does not verify ($3)"
}
expect_no_verify() {  # cafile cert purpose pattern
  local out
  if out=$(openssl verify -CAfile "$1" -purpose "$3" "$2" 2>&1); then
    fail "$2 verifies ($3) but should not"
  elif ! grep -q "$4" <<<"$out"; then
    fail "$2: expected '$4' from openssl verify, got: $out"
  fi
}
expect_ext() {  # cert extension pattern
  local out
  out=$(openssl x509 -in "$1" -noout -ext "$2" 2>&1)
  grep -qE "$3" <<<"$out" || fail "$1: $2 is not /$3/: $out"
}
expect_mode() {  # file mode
  local mode
  mode=$(stat -c %a "$1")
  [[ "$mode" == "$2" ]] || fail "$1 has mode $mode, not $2"
}
expect_exit() {  # code command...
  local want=$1 rc=0
  shift
  "$@" >/dev/null 2>&1 || rc=$?
  [[ $rc == "$want" ]] || fail "exit $rc (want $want): $*"
}
fingerprint() {
  openssl x509 -in "$1" -noout -fingerprint -sha256
}
serial() {
  openssl x509 -in "$1" -noout -serial
}
pubkey_matches() {  # cert key
  [[ "$(openssl x509 -in "$1" -noout -pubkey)" == "$(openssl pkey -in "$2" -pubout)" ]] ||
    fail "$2 is not the key of $1"
}

d="$work/fleet"
"$script" --out "$d" --server localhost,127.0.0.1,strata.example.com \
  --agent host-a,host-b --client alice --expired old >/dev/null

# The CA.
expect_ext "$d/ca.pem" basicConstraints "CA:TRUE"
expect_ext "$d/ca.pem" keyUsage "Certificate Sign"
expect_mode "$d/ca.key" 600
# The server: serverAuth, its names, not usable as a client.
expect_verify "$d/ca.pem" "$d/server.pem" sslserver
expect_no_verify "$d/ca.pem" "$d/server.pem" sslclient "unsuitable certificate purpose"
expect_ext "$d/server.pem" subjectAltName "DNS:localhost, IP Address:127.0.0.1, DNS:strata.example.com"
expect_ext "$d/server.pem" extendedKeyUsage "TLS Web Server Authentication"
openssl x509 -in "$d/server.pem" -noout -subject | grep -q "CN = localhost" || fail "server CN"
expect_mode "$d/server.key" 600
pubkey_matches "$d/server.pem" "$d/server.key"
openssl pkey -in "$d/server.key" -noout -text | grep -q "prime256v1" || fail "server key is not P-256"
# Agents and clients: clientAuth, CN and SAN DNS are the name, not usable as a server.
for c in agents/host-a agents/host-b clients/alice; do
  name=$(basename "$c")
  expect_verify "$d/ca.pem" "$d/$c.pem" sslclient
  expect_no_verify "$d/ca.pem" "$d/$c.pem" sslserver "unsuitable certificate purpose"
  expect_ext "$d/$c.pem" subjectAltName "^ *DNS:$name$"
  expect_ext "$d/$c.pem" extendedKeyUsage "^ *TLS Web Client Authentication$"
  openssl x509 -in "$d/$c.pem" -noout -subject | grep -q "CN = $name" || fail "$c CN"
  expect_mode "$d/$c.key" 600
  pubkey_matches "$d/$c.pem" "$d/$c.key"
done
# The expired one: signed by the CA, but expired.
expect_no_verify "$d/ca.pem" "$d/expired/old.pem" sslclient "certificate has expired"
openssl verify -CAfile "$d/ca.pem" -no_check_time "$d/expired/old.pem" >/dev/null 2>&1 ||
  fail "expired/old.pem does not chain to the CA"
! openssl x509 -in "$d/expired/old.pem" -noout -checkend 0 >/dev/null || fail "old.pem not expired"
# Another CA's certificates do not verify against this one.
"$script" --out "$work/other" --ca-name "Other CA" --client mallory >/dev/null
expect_no_verify "$d/ca.pem" "$work/other/clients/mallory.pem" sslclient "unable to get local issuer"

# A second run: the same CA, existing certificates kept, new ones signed by the same CA.
ca_before=$(fingerprint "$d/ca.pem")
host_a_before=$(serial "$d/agents/host-a.pem")
server_before=$(serial "$d/server.pem")
"$script" --out "$d" --agent host-a,host-c >/dev/null
[[ "$(fingerprint "$d/ca.pem")" == "$ca_before" ]] || fail "second run replaced the CA"
[[ "$(serial "$d/agents/host-a.pem")" == "$host_a_before" ]] || fail "second run reissued host-a"
[[ "$(serial "$d/server.pem")" == "$server_before" ]] || fail "second run reissued the server"
expect_verify "$d/ca.pem" "$d/agents/host-c.pem" sslclient
# --renew reissues what is named, by the same CA.
"$script" --out "$d" --agent host-a --renew >/dev/null
[[ "$(serial "$d/agents/host-a.pem")" != "$host_a_before" ]] || fail "--renew kept host-a"
[[ "$(fingerprint "$d/ca.pem")" == "$ca_before" ]] || fail "--renew replaced the CA"
[[ "$(serial "$d/server.pem")" == "$server_before" ]] || fail "--renew --agent reissued the server"
"$script" --out "$d" --renew --server localhost,127.0.0.1 >/dev/null
[[ "$(serial "$d/server.pem")" != "$server_before" ]] || fail "--renew --server kept the server"
expect_verify "$d/ca.pem" "$d/server.pem" sslserver
pubkey_matches "$d/server.pem" "$d/server.key"
expect_verify "$d/ca.pem" "$d/agents/host-a.pem" sslclient
pubkey_matches "$d/agents/host-a.pem" "$d/agents/host-a.key"
# --new-ca: a new CA, and what is named on that run is reissued by it.
"$script" --out "$d" --new-ca --agent host-b >/dev/null
[[ "$(fingerprint "$d/ca.pem")" != "$ca_before" ]] || fail "--new-ca kept the CA"
expect_verify "$d/ca.pem" "$d/server.pem" sslserver
expect_verify "$d/ca.pem" "$d/agents/host-b.pem" sslclient
expect_no_verify "$d/ca.pem" "$d/agents/host-c.pem" sslclient "unable to get local issuer"

# --ca-only, RSA keys.
"$script" --out "$work/ca-only" --ca-only >/dev/null
[[ "$(cd "$work/ca-only" && ls)" == "$(printf 'ca.key\nca.pem')" ]] ||
  fail "--ca-only made more than the CA: $(ls "$work/ca-only")"
"$script" --out "$work/rsa" --key-type rsa >/dev/null
expect_verify "$work/rsa/ca.pem" "$work/rsa/server.pem" sslserver
openssl pkey -in "$work/rsa/server.key" -noout -text | grep -q "3072 bit" || fail "RSA key size"

# Bad usage: exit 2, and nothing escapes the output directory.
expect_exit 2 "$script"
expect_exit 2 "$script" --out "$work/bad" --bogus
expect_exit 2 "$script" --out "$work/bad" --days abc
expect_exit 2 "$script" --out "$work/bad" --agent ../escape
expect_exit 2 "$script" --out "$work/bad" --client "a/b"
expect_exit 2 "$script" --out "$work/bad" --server "bad name"
expect_exit 2 "$script" --out "$work/bad" --key-type dsa
expect_exit 2 "$script" --out
expect_exit 0 "$script" --help
[[ ! -e "$work/escape.pem" && ! -e "$work/bad" ]] || fail "a refused run wrote files"

if [[ $failures -gt 0 ]]; then
  echo "gen_certs_test: $failures failure(s)" >&2
  exit 1
fi
echo "gen_certs_test: ok"
