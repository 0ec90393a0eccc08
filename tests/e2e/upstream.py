"""A test upstream for the end-to-end suite: HTTP on 80, HTTPS on 443 (certificate from the test CA),
raw TCP on 5432. Every answer names this upstream (UPSTREAM_NAME) and what the client asked for, so a
test can tell that the router connected to the right host.

Runs in a container on the agent-sandbox-egress network with --network-alias names.
"""

import http.server
import os
import socketserver
import ssl
import threading

NAME = os.environ.get("UPSTREAM_NAME", "upstream")
CERTS = os.environ.get("UPSTREAM_CERTS", "/srv/certs")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        proto = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        sni = getattr(self.connection, "sni", "") if proto == "https" else ""
        body = f"upstream={NAME} proto={proto} host={self.headers.get('Host', '')} sni={sni}\n"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class TLSServer(Server):
    def __init__(self, addr, handler, context):
        super().__init__(addr, handler)
        self.context = context

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.settimeout(10)
        seen = {}

        def remember(ssl_sock, server_name, _ctx):
            seen["sni"] = server_name or ""

        self.context.sni_callback = remember
        tls = self.context.wrap_socket(sock, server_side=True)
        tls.sni = seen.get("sni", "")
        return tls, addr


class Banner(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(f"upstream={NAME} proto=tcp\n".encode())
        line = self.rfile.readline()
        self.wfile.write(b"echo " + line)


class TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(f"{CERTS}/server.crt", f"{CERTS}/server.key")
    servers = [
        Server(("0.0.0.0", 80), Handler),
        TLSServer(("0.0.0.0", 443), Handler, ctx),
        TCPServer(("0.0.0.0", 5432), Banner),
    ]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    print(f"upstream {NAME} ready", flush=True)
    threads[0].join()


if __name__ == "__main__":
    main()
