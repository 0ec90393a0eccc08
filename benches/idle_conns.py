#!/usr/bin/env python3
"""Idle client connections for the RSS bench: opens PER connections from each of COUNT consecutive source
addresses starting at FIRST (the addresses must exist on this host or namespace) to IP:PORT, either plain
TCP sending nothing (--mode tcp: the server holds them in its hello/head wait) or through a TLS handshake
with SNI NAME and then nothing (--mode tls: the server holds an established relay). Prints
`open N failed M reasons` once all attempts finished, then holds the connections until stdin closes.
Connects only to the IP address it is given."""

import argparse
import asyncio
import collections
import ipaddress
import ssl
import sys


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ip", required=True)
    p.add_argument("--port", type=int, default=443)
    p.add_argument("--first", required=True, help="first source address")
    p.add_argument("--count", type=int, default=100, help="source addresses")
    p.add_argument("--per", type=int, default=100, help="connections per source address")
    p.add_argument("--mode", choices=["tcp", "tls"], default="tls")
    p.add_argument("--name", default="upstream.test")
    p.add_argument("--batch", type=int, default=400, help="connection attempts in flight")
    p.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args()

    ctx = None
    if a.mode == "tls":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    first = ipaddress.ip_address(a.first)
    # Round-robin over the sources, so every client address is in use from the start, like real clients.
    sources = [str(first + (i % a.count)) for i in range(a.count * a.per)]

    async def connect(src):
        kw = {"ssl": ctx, "server_hostname": a.name} if ctx else {}
        return await asyncio.wait_for(
            asyncio.open_connection(a.ip, a.port, local_addr=(src, 0), **kw), a.timeout
        )

    held, reasons = [], collections.Counter()
    for start in range(0, len(sources), a.batch):
        batch = sources[start : start + a.batch]
        for r in await asyncio.gather(*(connect(s) for s in batch), return_exceptions=True):
            if isinstance(r, BaseException):
                reasons[type(r).__name__] += 1
            else:
                held.append(r)
    print(
        f"open {len(held)} failed {sum(reasons.values())}"
        f" {','.join(f'{k}:{v}' for k, v in reasons.items()) or '-'}",
        flush=True,
    )
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for _, w in held:
        w.close()


if __name__ == "__main__":
    asyncio.run(main())
