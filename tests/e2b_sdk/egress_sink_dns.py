"""The stand-in resolver of egress-sink.sh: answers every DNS question (UDP and TCP) REFUSED
and logs its name and type, one line each.

    python3 egress_sink_dns.py ADDRESS LOGFILE READYFILE

READYFILE is made once it listens.
"""

import socket
import struct
import sys
import threading
import time

addr, log = sys.argv[1], open(sys.argv[2], "a", buffering=1)


def refuse(msg: bytes) -> bytes:
    i, labels = 12, []
    while i < len(msg) and msg[i]:
        n = msg[i]
        labels.append(msg[i + 1 : i + 1 + n].decode(errors="replace"))
        i += 1 + n
    qtype = struct.unpack("!H", msg[i + 1 : i + 3])[0] if i + 3 <= len(msg) else 0
    log.write(f"{time.strftime('%H:%M:%S')} {'.'.join(labels)} type={qtype}\n")
    flags = 0x8000 | (struct.unpack("!H", msg[2:4])[0] & 0x0100) | 5  # a response, RD kept, REFUSED
    return msg[:2] + struct.pack("!HHHHH", flags, 1, 0, 0, 0) + msg[12 : i + 5]


def tcp(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        try:
            (n,) = struct.unpack("!H", conn.recv(2))
            reply = refuse(conn.recv(n))
            conn.sendall(struct.pack("!H", len(reply)) + reply)
        except (OSError, struct.error):
            pass
        conn.close()


udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((addr, 53))
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((addr, 53))
server.listen()
threading.Thread(target=tcp, args=(server,), daemon=True).start()
open(sys.argv[3], "w").close()
while True:
    msg, peer = udp.recvfrom(4096)
    try:
        udp.sendto(refuse(msg), peer)
    except (OSError, struct.error):
        pass
