"""Listen on a port in a way that hides the listener from a plain /proc/*/fd scan.

``--main-exits``: the main thread exits (``pthread_exit``) while another thread keeps
running; the kernel shows the process as a zombie and its ``/proc/PID/fd`` empty, yet
the socket stays open (what a multi-threaded engine looks like while it is torn down).
``--not-dumpable``: ``prctl(PR_SET_DUMPABLE, 0)``; another process of the same user
(without root) may then not read its descriptors.
"""

import ctypes
import socket
import sys
import threading
import time

PR_SET_DUMPABLE = 4

port = int(sys.argv[1])
mode = sys.argv[2]
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
sock.listen()
libc = ctypes.CDLL(None)
if mode == "--not-dumpable":
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
print("listening", flush=True)
if mode == "--main-exits":
    threading.Thread(target=lambda: time.sleep(3600)).start()
    libc.pthread_exit(None)
while True:
    time.sleep(1)
