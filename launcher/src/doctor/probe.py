# The containment probe of `agent-sandbox doctor`: run inside the sandbox image as the agent's user
# (`python3 -I -S -c PROBE SPEC_JSON`, so nothing from the home or the environment runs before it: it
# uses the standard library only, and its session's home volume is a new one of its own). It only ever sends to the addresses the launcher put in SPEC: this
# host's own addresses, its resolvers, the router's egress side, and the loopback addresses the
# router's DNS hands out. One JSON line per check: {"name", "ok", "tried", "got"}. Where nested podman
# can run, SPEC["nested"] says how to run the static nested probe in a nested container; its lines are
# passed on after a "nested-podman" line that says whether it ran.
import errno
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

TIMEOUT = 2.0
# Each nested podman step (import, run, rmi); the run itself takes about one TIMEOUT.
NESTED_TIMEOUT = 8.0
SPEC = json.loads(sys.argv[1])
LOCK = threading.Lock()


# Why the checks that need an allowlisted name are skipped when the allowlist is empty.
EMPTY_ALLOWLIST = ("skipped: the allowlist is empty, so no name resolves in the sandbox and no address of the "
                   "router's carries a connection (add a name to test these)")


def emit(name, ok, tried, got, warn=False, skip=False):
    line = {"name": name, "ok": bool(ok), "tried": tried, "got": got, "warn": warn}
    if skip:
        line["skip"] = True
    with LOCK:
        print(json.dumps(line), flush=True)


def nameserver():
    with open("/etc/resolv.conf") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                return parts[1]
    return None


def query(name, qid):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", 1, 1)


def skip_name(r, i):
    while i < len(r):
        n = r[i]
        if n & 0xC0 == 0xC0:
            return i + 2
        if n == 0:
            return i + 1
        i += n + 1
    raise ValueError("truncated name")


def parse(r, qid):
    """(rcode, [A addresses]) of a response to our query."""
    if len(r) < 12:
        raise ValueError("short answer")
    rid, flags, qd, an = struct.unpack(">HHHH", r[:8])
    if rid != qid:
        raise ValueError("answer to another query")
    i = 12
    for _ in range(qd):
        i = skip_name(r, i) + 4
    addrs = []
    for _ in range(an):
        i = skip_name(r, i)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if rtype == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(r[i:i + 4]))
        i += rdlen
    return flags & 0xF, addrs


def dns_udp(server, name, family=socket.AF_INET, port=53):
    qid = int.from_bytes(os.urandom(2), "big")
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.settimeout(TIMEOUT)
    try:
        s.sendto(query(name, qid), (server, port))
        return parse(s.recv(1500), qid)
    finally:
        s.close()


def dns_tcp(server, name):
    qid = int.from_bytes(os.urandom(2), "big")
    q = query(name, qid)
    with socket.create_connection((server, 53), timeout=TIMEOUT) as s:
        s.sendall(struct.pack(">H", len(q)) + q)
        data = b""
        while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
            chunk = s.recv(1500)
            if not chunk:
                break
            data += chunk
        return parse(data[2:], qid)


def describe(e):
    # An SSLError's errno is OpenSSL's error kind (1 for every verification failure), not errno's.
    if isinstance(e, ssl.SSLError):
        return f"{type(e).__name__}: {e.reason or e}"
    if isinstance(e, socket.timeout):
        return ("timed out: it was sent somewhere (an address the sandbox has no route to fails at "
                "once) and nothing answered")
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno)) + " (" + os.strerror(e.errno) + ")"
    return str(e)


BLOCKED = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.EADDRNOTAVAIL,
           errno.EAFNOSUPPORT}


def blocked(e):
    """Whether a failure is the sandbox's own refusal to send: with no route off its network, a blocked
    address fails at once with one of BLOCKED. A timeout is not one: the packet went somewhere."""
    return isinstance(e, OSError) and not isinstance(e, socket.timeout) and e.errno in BLOCKED


# IP_RECVERR and IPV6_RECVERR (Linux; Python 3.11 names neither): the kernel reports ICMP errors that
# come back for what a socket sent, and queues where they came from (MSG_ERRQUEUE).
RECVERR = {socket.AF_INET: (socket.IPPROTO_IP, 11), socket.AF_INET6: (socket.IPPROTO_IPV6, 25)}
# sock_extended_err.ee_origin of an error that an ICMP (or ICMPv6) message brought back.
ORIGIN_ICMP = (2, 3)


def report_icmp(s, family):
    level, option = RECVERR[family]
    s.setsockopt(level, option, 1)


def icmp_from(s):
    """The sender of an ICMP error that came back for what s sent, or None: an error the sandbox's own
    kernel made (no route) never leaves it, one from the network shows that the packet did."""
    try:
        _, ancillary, _, _ = s.recvmsg(1, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
    except OSError:
        return None
    for _level, _kind, data in ancillary:
        # struct sock_extended_err (16 bytes: ee_origin at 4), then the offender's sockaddr.
        if len(data) >= 16 and data[4] in ORIGIN_ICMP:
            offender = data[16:]
            if len(offender) >= 8 and int.from_bytes(offender[:2], sys.byteorder) == socket.AF_INET:
                return socket.inet_ntoa(offender[4:8])
            if len(offender) >= 24 and int.from_bytes(offender[:2], sys.byteorder) == socket.AF_INET6:
                return socket.inet_ntop(socket.AF_INET6, offender[8:24])
            return "an unknown address"
    return None


def check_dns(router):
    name, expect, unlisted = SPEC["name"], SPEC["expect"], SPEC["unlisted"]
    if not name:
        emit("dns-allowlisted", True, f"an allowlisted name from the router {router}", EMPTY_ALLOWLIST,
             skip=True)
    else:
        try:
            rcode, addrs = dns_udp(router, name)
            emit("dns-allowlisted", rcode == 0 and addrs == [expect],
                 f"A {name} from the router {router}",
                 f"rcode {rcode}, {addrs or 'no address'} (want {expect})")
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            emit("dns-allowlisted", False, f"A {name} from the router {router}", describe(e))
    for proto, ask in (("udp", dns_udp), ("tcp", dns_tcp)):
        tried = f"A {unlisted} from the router over {proto.upper()}"
        try:
            rcode, addrs = ask(router, unlisted)
            emit(f"dns-unlisted-{proto}", rcode == 3 and not addrs, tried,
                 "NXDOMAIN" if rcode == 3 and not addrs else f"rcode {rcode}, {addrs}")
        except Exception as e:  # noqa: BLE001
            emit(f"dns-unlisted-{proto}", False, tried, describe(e))


def connect(kind, ip, port):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    tried = f"TCP to {kind} {ip} port {port}"
    name = f"tcp-{kind}-{ip}"
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        report_icmp(s, family)
    except OSError as e:
        # Only a sandbox without the address family passes: any other failure tried nothing.
        emit(name, e.errno == errno.EAFNOSUPPORT, tried, "no socket: " + describe(e))
        return
    s.settimeout(TIMEOUT)
    try:
        s.connect((ip, port))
        emit(name, False, tried, "connected")
    except ConnectionRefusedError:
        emit(name, False, tried, "refused by the target: the packet got there")
    except OSError as e:
        sender = icmp_from(s)
        if sender is not None:
            emit(name, False, tried, f"{describe(e)}, reported by {sender}: the packet left the sandbox")
        else:
            emit(name, blocked(e), tried, describe(e))
    finally:
        s.close()


def udp(kind, ip, port):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    name = f"udp-{kind}-{ip}"
    tried = f"UDP to {kind} {ip} port {port}"
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.sendto(b"agent-sandbox doctor", (ip, port))
        s.close()
        # Sent: whether it arrived is for the launcher's listener on this host to say.
        emit(name + "-sent", True, tried, "sent (the launcher's listener checks it never arrives)")
    except OSError as e:
        emit(name + "-sent", blocked(e), tried, describe(e))


def other_dns(kind, ip, port):
    """Only a query the sandbox refuses to send passes. Once sent, any outcome shows that it left: an
    answer (from whatever address: a host answers from the one its route picks, so the socket is not
    connected), an ICMP error (reported through IP_RECVERR), or silence."""
    name = f"dns-{kind}-{ip}"
    # The allowlisted name (what an agent would want answered), or the unlisted one when the allowlist is
    # empty: any answer at all is the failure.
    asked = SPEC["name"] or SPEC["unlisted"]
    tried = f"A {asked} from {kind} {ip} port {port} (not the router)"
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    qid = int.from_bytes(os.urandom(2), "big")
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
        report_icmp(s, family)
    except OSError as e:
        emit(name, e.errno == errno.EAFNOSUPPORT, tried, "no socket: " + describe(e))
        return
    with s:
        s.settimeout(TIMEOUT)
        try:
            s.sendto(query(asked, qid), (ip, port))
        except OSError as e:
            emit(name, blocked(e), tried, describe(e))
            return
        try:
            rcode, addrs = parse(s.recv(1500), qid)
            emit(name, False, tried, f"answered: rcode {rcode}, {addrs}")
        except socket.timeout as e:
            emit(name, False, tried, describe(e))
        except OSError as e:
            sender = icmp_from(s) or "the network"
            emit(name, False, tried, f"{describe(e)}, reported by {sender}: the query left the sandbox")
        except ValueError as e:
            emit(name, False, tried, f"something came back: {e}")


def hello(sni):
    sni = sni.encode()
    ext = struct.pack(">HHHBH", 0, len(sni) + 5, len(sni) + 3, 0, len(sni)) + sni
    ext += bytes.fromhex("002b0003020304" "000a00040002001d" "000d000400020403")
    ext += bytes.fromhex("003300260024001d0020") + os.urandom(32)
    body = b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32)
    body += bytes.fromhex("000413011302" "0100") + struct.pack(">H", len(ext)) + ext
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


def check_refusals():
    ip, unlisted = SPEC["expect"], SPEC["unlisted"]
    if not SPEC["name"]:
        emit("tls-unlisted-sni", True, f"TLS ClientHello with SNI {unlisted} to an allowlisted name's address",
             EMPTY_ALLOWLIST, skip=True)
        emit("http-unlisted-host", True, f"HTTP GET with Host {unlisted} to an allowlisted name's address",
             EMPTY_ALLOWLIST, skip=True)
        return
    if not ip:
        for check in ("tls-unlisted-sni", "http-unlisted-host"):
            emit(check, False, f"the address of {SPEC['name']} in the sandbox", "the session gave it none")
        return
    tried = f"TLS ClientHello with SNI {unlisted} to {ip}:443"
    try:
        with socket.create_connection((ip, 443), timeout=TIMEOUT) as s:
            s.sendall(hello(unlisted))
            r = b""
            while len(r) < 7:
                chunk = s.recv(7 - len(r))
                if not chunk:
                    break
                r += chunk
        ok = len(r) >= 7 and r[0] == 0x15 and r[6] == 49
        got = "access_denied alert" if ok else f"{r.hex() or 'nothing'}"
        emit("tls-unlisted-sni", ok, tried, got)
    except Exception as e:  # noqa: BLE001
        emit("tls-unlisted-sni", False, tried, describe(e))
    tried = f"HTTP GET with Host {unlisted} to {ip}:80"
    try:
        with socket.create_connection((ip, 80), timeout=TIMEOUT) as s:
            s.sendall(f"GET / HTTP/1.1\r\nHost: {unlisted}\r\nConnection: close\r\n\r\n".encode())
            r = b""
            while len(r) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                r += chunk
        text = r.decode("latin-1")
        first = text.split("\r\n", 1)[0]
        emit("http-unlisted-host", " 403 " in first + " " and unlisted in text, tried,
             first or "nothing")
    except Exception as e:  # noqa: BLE001
        emit("http-unlisted-host", False, tried, describe(e))


def check_ipv6():
    try:
        with open("/proc/net/if_inet6") as f:
            addrs = [line.split() for line in f if line.strip()]
    except OSError:
        addrs = []
    other = [a[-1] + " " + a[0] for a in addrs if a[-1] != "lo"]
    emit("no-ipv6", not other, "IPv6 addresses of the sandbox's interfaces (/proc/net/if_inet6)",
         "none beside loopback" if not other else ", ".join(other))


def check_process():
    caps = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Cap"):
                k, v = line.split(":")
                caps[k] = int(v.strip(), 16)
    held = {k: hex(v) for k, v in caps.items() if k != "CapBnd" and v}
    emit("no-capabilities", not held, "capabilities of the agent's process (/proc/self/status)",
         "none" if not held else f"holds {held}")
    for path in ("/etc/hosts", "/etc/resolv.conf"):
        try:
            with open(path, "a"):
                pass
            emit(f"read-only-{path}", False, f"open {path} for writing", "opened")
        except OSError as e:
            emit(f"read-only-{path}", e.errno in (errno.EROFS, errno.EACCES, errno.EPERM),
                 f"open {path} for writing", describe(e))
    uid = os.getuid()
    sockets = ["/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock",
               f"/run/user/{uid}/podman/podman.sock"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        sockets.append(os.path.join(runtime, "podman/podman.sock"))
    found = [p for p in sockets if os.path.exists(p)]
    mounts = mountinfo()
    found += [m for m in mounts if m.endswith(".sock")]
    emit("no-podman-socket", not found, "podman and docker API sockets", ", ".join(found) or "none")
    secrets = None
    if "/run/secrets" in mounts:
        try:
            secrets = sorted(os.listdir("/run/secrets"))
        except OSError as e:
            secrets = ["(unreadable: " + describe(e) + ")"]
    extra = unexpected_mounts(mounts, secrets)
    emit("host-mounts", not extra, "mounts beside the image, the project and the home volume",
         "none" if not extra else ", ".join(extra))


# Kernel file systems, each with what is below it.
SYSTEM_MOUNTS = ("/proc", "/dev", "/sys")


def unexpected_mounts(mounts, secrets):
    """The mount points that podman's own set-up, the project, the home volume and the session's CA do
    not explain. /run/secrets passes only empty (`secrets`: its listing): a mounts.conf entry (RHEL's
    /usr/share/rhel/secrets, or one of the user's) fills it from the host."""
    allowed = {"/", SPEC["project"], SPEC["home"], "/etc/hosts", "/etc/resolv.conf", "/etc/hostname",
               "/run/.containerenv", "/etc/passwd", "/etc/group", "/run/podman-init",
               # Credential injection: the session CA and the bundle with it (no secret in either).
               "/etc/agent-sandbox/session-ca.pem", "/etc/ssl/certs/ca-certificates.crt"}
    extra = []
    for m in sorted(set(mounts)):
        if m in allowed or any(m == p or m.startswith(p + "/") for p in SYSTEM_MOUNTS):
            continue
        if m == "/run/secrets":
            if secrets:
                extra.append("/run/secrets (holding " + ", ".join(secrets[:5]) + ")")
            continue
        extra.append(m)
    return extra


def check_setuid():
    start = time.monotonic()
    try:
        out = subprocess.run(["find", "/", "-xdev", "-perm", "/6000", "-type", "f"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        # The walk's time shows where a slow run went (a cold cache after an image load).
        took = f" ({time.monotonic() - start:.1f}s)"
        emit("no-setuid", not out, "setuid/setgid files (find / -xdev -perm /6000)",
             ("none" if not out else ", ".join(out[:5])) + took)
    except Exception as e:  # noqa: BLE001
        emit("no-setuid", False, "find / -xdev -perm /6000", describe(e))


def mountinfo():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4:
                points.append(parts[4].replace("\\040", " "))
    return points


def last_line(text):
    return (text.strip().splitlines() or [""])[-1]


def check_nested():
    """The static nested probe, in a nested container of the sandbox's own podman (--network host)."""
    nested = SPEC["nested"]
    image, tarball = nested["image"], nested["tarball"]
    tried = f"podman import {tarball}; podman run --network host: the nested probe"
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError as e:
        emit("nested-podman", False, tried, "reading /proc/self/ns/net: " + describe(e))
        return

    took = []

    def podman(*args):
        start = time.monotonic()
        try:
            return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=NESTED_TIMEOUT)
        finally:
            took.append(f"{args[0]} {time.monotonic() - start:.1f}s")

    try:
        r = podman("import", "--quiet", tarball, image)
        if r.returncode != 0:
            emit("nested-podman", False, tried, f"podman import: exit {r.returncode}: {last_line(r.stderr)}")
            return
        try:
            r = podman("run", "--rm", "--network", "host", image, *nested["command"], "--netns", netns)
        finally:
            # The doctor removes the session's home volume (a throw-away one) and everything in it;
            # removing the image anyway keeps a home this probe is ever run in free of it.
            podman("rmi", "--force", image)
    except Exception as e:  # noqa: BLE001 - every failure is the answer
        emit("nested-podman", False, tried, describe(e))
        return
    lines = []
    for line in r.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str) and name.startswith("nested-") and name != "nested-podman":
            lines.append(item)
    ran = r.returncode == 0 and bool(lines)
    emit("nested-podman", ran, tried,
         f"a nested container ran the probe ({len(lines)} checks below; {', '.join(took)})" if ran
         else f"podman run: exit {r.returncode}: {last_line(r.stderr)}")
    for item in lines:
        emit(item["name"], item.get("ok") is True, str(item.get("tried", "")), str(item.get("got", "")),
             skip=item.get("skip") is True)


# The common name's start of a session CA's (launcher/src/inject/ca.rs): a name whose certificate it
# issued is terminated by the router, which adds a credential and dials the upstream on the first request.
SESSION_CA = "agent-sandbox session "
# How long a terminated name's answer may take: the router's connect timeout (10 s) and its TLS with the
# upstream come first.
TERMINATED_TIMEOUT = 25.0
# The most of that answer read.
MAX_ANSWER = 8192


def check_reach(name):
    tried = f"HTTPS handshake with {name}:443 through the router"
    try:
        ctx = ssl.create_default_context()
        with socket.create_connection((name, 443), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                issuer = dict(pair[0] for pair in s.getpeercert().get("issuer", ()) if pair)
                if not issuer.get("commonName", "").startswith(SESSION_CA):
                    emit(f"reach-{name}", True, tried, f"{s.version()} with {name}")
                    return
                # The handshake was with the router itself: only a request shows the upstream answers.
                tried = f"HTTPS HEAD / to {name} through the router (which terminates it to add a credential)"
                s.settimeout(TERMINATED_TIMEOUT)
                s.sendall(f"HEAD / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
                answer = b""
                try:
                    while len(answer) < MAX_ANSWER:
                        chunk = s.recv(MAX_ANSWER - len(answer))
                        if not chunk:
                            break
                        answer += chunk
                except (OSError, ssl.SSLError) as e:
                    if not answer:
                        raise
                ok, got = judge_terminated(answer)
                emit(f"reach-{name}", ok, tried, got)
    except Exception as e:  # noqa: BLE001
        emit(f"reach-{name}", False, tried, describe(e))


def judge_terminated(answer):
    """(ok, what came back) for the answer to HEAD / through the router's terminator: the upstream's
    answer passes, whatever its status; the router's own (a 403 or 502 whose body begins with
    "agent-sandbox:", since a HEAD's answer from the upstream has none) or none at all fails."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if not status.startswith("HTTP/"):
        return False, "no HTTP answer" + (f": {status[:80]!r}" if status else "")
    if body.startswith(b"agent-sandbox:"):
        reason = body.split(b"\n", 1)[0].decode("utf-8", "replace")
        return False, f"the router answered {status}: {reason}"
    return True, f"the upstream answered {status}"


def main():
    router = nameserver()
    # The slow checks (a walk of the image, nested podman's start) run beside the network ones.
    threads = [threading.Thread(target=check_setuid)]
    if SPEC.get("nested"):
        threads.append(threading.Thread(target=check_nested))
    for kind, ip, port in SPEC["tcp"]:
        threads.append(threading.Thread(target=connect, args=(kind, ip, port)))
    for kind, ip, port in SPEC["dns"]:
        threads.append(threading.Thread(target=other_dns, args=(kind, ip, port)))
    for t in threads:
        t.start()
    if router:
        check_dns(router)
    else:
        emit("dns-allowlisted", False, "read /etc/resolv.conf", "no nameserver")
    for kind, ip, port in SPEC["udp"]:
        udp(kind, ip, port)
    check_refusals()
    check_ipv6()
    check_process()
    for name in SPEC.get("reach", []):
        check_reach(name)
    for t in threads:
        t.join()


main()
