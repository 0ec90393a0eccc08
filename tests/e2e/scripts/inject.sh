#!/bin/bash
# The `inject` scenario's command (launcher/tests/e2e/scenarios/inject.rs), run in the sandbox with the
# part as its argument: `no-inject` (the key in the environment, the stand-in's test CA trusted by hand)
# or `inject` (the sandbox holds a placeholder and trusts the session CA only). Claude Code talks to
# api.anthropic.com, which the session's router resolves through the suite's own DNS to its stand-in.
# shellcheck source-path=SCRIPTDIR source=helpers.sh
. ./helpers.sh
part=$1
env > "env-$part.txt"
if [ "$part" = no-inject ]; then
  export NODE_EXTRA_CA_CERTS=$PWD/ca.crt
else
  ca=/etc/agent-sandbox/session-ca.pem
  bundle=/etc/ssl/certs/ca-certificates.crt
  t session-ca-mounted test -s "$ca"
  t node-extra-ca-certs test "$NODE_EXTRA_CA_CERTS" = "$ca"
  t ssl-cert-file test "$SSL_CERT_FILE" = "$bundle" -a "$REQUESTS_CA_BUNDLE" = "$bundle"
  t bundle-has-session-ca grep -qF "$(sed -n 2p "$ca")" "$bundle"
  t bundle-keeps-system-roots test "$(grep -c 'BEGIN CERTIFICATE' "$bundle")" -gt 50
  f bundle-read-only sh -c "echo x >> $bundle"
  f ca-key-invisible test -e /etc/agent-sandbox-inject
  t placeholder-key test "${ANTHROPIC_API_KEY#sk-ant-api03-}" != "$ANTHROPIC_API_KEY"
  touch ready
fi
timeout 180 claude -p hello > "claude-$part.out" 2> "claude-$part.err"
echo $? > "claude-$part.rc"
# The home volume only: rootless, the project is mounted below $HOME's path.
tar --one-file-system -C "$HOME" -cf "home-$part.tar" . 2>/dev/null
if [ "$part" = inject ]; then
  # The suite inspects the running session's containers, then says so.
  for _ in $(seq 1 1500); do [ -e inspected ] && break; sleep 0.2; done
fi
exit 0
