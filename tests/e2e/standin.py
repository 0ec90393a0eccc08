"""A stand-in api.anthropic.com and platform.claude.com for the end-to-end suite's `inject` scenario,
and the router's DNS.

- DNS on UDP 53: `api.anthropic.com` and `platform.claude.com` A are this container's own address;
  every other name is NXDOMAIN. Nothing is ever forwarded, so a router pointed here can resolve no real
  name.
- HTTPS on 443 (certificate from the suite's test CA, for both names): a canned Messages API. POST
  /v1/messages answers a short streamed message (server-sent events, message_start ... message_stop)
  when the request asks for a stream, else the same message as JSON. POST /v1/oauth/token (the token
  endpoint) answers new tokens: STANDIN_NEW_ACCESS and STANDIN_NEW_REFRESH from the environment (the
  suite's own fakes). Anything else gets `{}`.

Every request is logged on stdout as one line `request METHOD PATH host=<Host> key=<x-api-key>
auth=<authorization> refresh=<the body's refresh_token>`, so the suite can tell which credentials
arrived. The credentials are the suite's own fake ones.

Runs in a container on the agent-sandbox-egress network, started and removed by the suite.
"""

import http.server
import json
import os
import socket
import socketserver
import ssl
import sys
import threading

CERTS = os.environ.get("STANDIN_CERTS", "/srv/certs")
NAMES = ("api.anthropic.com", "platform.claude.com")
TEXT = "stand-in says hello"


def log(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def own_address():
    return socket.gethostbyname(socket.gethostname())


def dns_answer(query, address):
    """The answer to one DNS query (None: drop it)."""
    if len(query) < 17 or query[2] & 0x80:
        return None
    i, labels = 12, []
    while i < len(query) and query[i] != 0:
        n = query[i]
        if n > 63 or i + 1 + n > len(query):
            return None
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    i += 1
    if i + 4 > len(query):
        return None
    qtype = int.from_bytes(query[i : i + 2], "big")
    question = query[12 : i + 4]
    name = ".".join(labels)
    flags = 0x8400 | (query[2] & 0x01) << 8  # response, authoritative, RD copied
    if name not in NAMES:
        header = query[:2] + (flags | 3).to_bytes(2, "big") + b"\x00\x01\x00\x00\x00\x00\x00\x00"
        return header + question
    if qtype != 1:
        header = query[:2] + flags.to_bytes(2, "big") + b"\x00\x01\x00\x00\x00\x00\x00\x00"
        return header + question
    header = query[:2] + flags.to_bytes(2, "big") + b"\x00\x01\x00\x01\x00\x00\x00\x00"
    answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04" + socket.inet_aton(address)
    return header + question + answer


def serve_dns(address):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 53))
    while True:
        query, peer = sock.recvfrom(4096)
        reply = dns_answer(query, address)
        if reply is not None:
            sock.sendto(reply, peer)


def message(model):
    return {
        "id": "msg_standin",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def sse(model):
    events = [
        ("message_start", {"type": "message_start", "message": message(model)}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 4},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or "0"))

    def reply(self, status, ctype, data):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self):
        data = self.body()
        try:
            refresh = json.loads(data or b"{}").get("refresh_token", "")
        except (ValueError, AttributeError):
            refresh = ""
        log(
            f"request {self.command} {self.path} host={self.headers.get('Host', '')} "
            f"key={self.headers.get('x-api-key', '')} auth={self.headers.get('Authorization', '')} "
            f"refresh={refresh}"
        )
        if self.command == "POST" and self.path.split("?")[0] == "/v1/oauth/token":
            tokens = {
                "token_type": "Bearer",
                "access_token": os.environ.get("STANDIN_NEW_ACCESS", ""),
                "refresh_token": os.environ.get("STANDIN_NEW_REFRESH", ""),
                "expires_in": 28800,
                "scope": "user:inference user:profile",
            }
            self.reply(200, "application/json", json.dumps(tokens).encode())
            return
        if self.command == "POST" and self.path.split("?")[0] == "/v1/messages":
            try:
                req = json.loads(data or b"{}")
            except ValueError:
                req = {}
            model = req.get("model", "claude-standin")
            if req.get("stream"):
                self.reply(200, "text/event-stream", sse(model))
            else:
                done = message(model)
                done["content"] = [{"type": "text", "text": TEXT}]
                done["stop_reason"] = "end_turn"
                self.reply(200, "application/json", json.dumps(done).encode())
            return
        self.reply(200, "application/json", b"{}")

    do_GET = do_POST = do_PUT = do_HEAD = handle_any

    def log_message(self, *args):
        pass


class TLSServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, context):
        super().__init__(addr, handler)
        self.context = context

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.settimeout(30)
        return self.context.wrap_socket(sock, server_side=True), addr


def main():
    address = os.environ.get("STANDIN_ADDRESS") or own_address()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(f"{CERTS}/server.crt", f"{CERTS}/server.key")
    server = TLSServer(("0.0.0.0", 443), Handler, ctx)
    threading.Thread(target=serve_dns, args=(address,), daemon=True).start()
    log(f"ready address={address}")
    server.serve_forever()


if __name__ == "__main__":
    main()
