"""Connect to a TCP listener and send to a UDP socket on the host's loopback."""

import socket


def attack():
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.sendto(b"escaped", ("127.0.0.1", int("__UDP_PORT__")))
    except OSError as exc:
        print("udp blocked:", exc)
    with socket.create_connection(("127.0.0.1", int("__TCP_PORT__")), timeout=2) as conn:
        conn.sendall(b"escaped")
    return "escaped"
