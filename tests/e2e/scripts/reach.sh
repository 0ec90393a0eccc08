#!/usr/bin/env bash
# What the sandbox can reach: allowlisted names by DNS, HTTPS, HTTP and a host:port entry; nothing else.
set -u
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
ip_of() { getent ahostsv4 "$1" | awk 'NR==1{print $1}'; }
t resolve-exact test "$(ip_of web.test)" = 127.0.0.2
t resolve-wildcard test "$(ip_of www.wild.test)" = 127.0.0.2
t resolve-apex test "$(ip_of wild.test)" = 127.0.0.2
t resolve-port-host test "$(ip_of db.test)" = 127.0.0.3
out=$(curl -sS --max-time 10 --cacert ca.crt https://web.test/)
t https-exact grep -q "upstream=a proto=https host=web.test sni=web.test" <<<"$out"
out=$(curl -sS --max-time 10 --cacert ca.crt https://www.wild.test/)
t https-wildcard grep -q "upstream=a proto=https host=www.wild.test sni=www.wild.test" <<<"$out"
out=$(curl -sS --max-time 10 http://web.test/)
t http-exact grep -q "upstream=a proto=http host=web.test" <<<"$out"
out=$(curl -sS --max-time 10 http://www.wild.test/)
t http-wildcard grep -q "upstream=a proto=http host=www.wild.test" <<<"$out"
out=$(timeout 10 bash -c 'exec 3<>/dev/tcp/db.test/5432; echo hello >&3; cat <&3')
t tcp-port-entry grep -q "upstream=b proto=tcp" <<<"$out"
t nxdomain-unlisted bash -c 'dig +time=3 +tries=1 blocked.test A | grep -q "status: NXDOMAIN"'
f unlisted-connect-fails curl -sS --max-time 5 --cacert ca.crt https://blocked.test/
t nxdomain-lookalike bash -c 'dig +time=3 +tries=1 web.test.evil.example A | grep -q "status: NXDOMAIN"'
f sni-spoof-refused curl -sS --max-time 5 --cacert ca.crt --resolve blocked.test:443:127.0.0.2 https://blocked.test/
out=$(curl -sS --max-time 5 -H 'Host: blocked.test' http://127.0.0.2/ 2>&1)
f host-spoof-refused grep -q "upstream=" <<<"$out"
# shellcheck disable=SC2016 # expanded by the inner bash
t aaaa-empty bash -c 'r=$(dig +time=3 +tries=1 web.test AAAA); grep -q "status: NOERROR" <<<"$r" && grep -q "ANSWER: 0," <<<"$r"'
