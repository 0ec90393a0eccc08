#!/bin/bash
# The `inject` scenario's command (launcher/tests/e2e/scenarios/inject.rs), run in the sandbox with the
# part as its argument: `no-inject` (the key in the environment, the stand-in's test CA trusted by hand),
# `inject` (the sandbox holds a placeholder and trusts the session CA only) or `oauth` (no key; the
# credentials file on the home volume holds placeholders of the sign-in tokens). Claude Code talks to
# api.anthropic.com (and the token endpoint on platform.claude.com), which the session's router resolves
# through the suite's own DNS to its stand-in.
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
  f token-store-invisible test -e /etc/agent-sandbox-oauth
  if [ "$part" = oauth ]; then
    t no-api-key test -z "${ANTHROPIC_API_KEY-}"
    cp "$HOME/.claude/.credentials.json" creds-before.json
    touch ready
    # The suite reads the token store as the launcher left it, then says so.
    for _ in $(seq 1 1500); do [ -e store-checked ] && break; sleep 0.2; done
  else
    t placeholder-key test "${ANTHROPIC_API_KEY#sk-ant-api03-}" != "$ANTHROPIC_API_KEY"
  fi
  touch ready
fi
timeout 180 claude -p hello > "claude-$part.out" 2> "claude-$part.err"
echo $? > "claude-$part.rc"
if [ "$part" = oauth ]; then
  # A refresh as Claude Code sends it, with the placeholder the credentials file holds, through the
  # session CA (curl reads the mounted bundle).
  refresh=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["claudeAiOauth"]["refreshToken"])' creds-before.json)
  body=$(printf '{"grant_type":"refresh_token","refresh_token":"%s","client_id":"e2e","scope":"user:inference"}' "$refresh")
  curl -sS --max-time 60 -H 'Content-Type: application/json' --data "$body" \
    https://platform.claude.com/v1/oauth/token > refresh.out 2> refresh.err
  echo $? > refresh.rc
  cp "$HOME/.claude/.credentials.json" creds-after.json
fi
# The home volume only: rootless, the project is mounted below $HOME's path.
tar --one-file-system -C "$HOME" -cf "home-$part.tar" . 2>/dev/null
if [ "$part" != no-inject ]; then
  # The suite inspects the running session's containers, then says so.
  for _ in $(seq 1 1500); do [ -e inspected ] && break; sleep 0.2; done
fi
exit 0
