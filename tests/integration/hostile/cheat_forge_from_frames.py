"""Cheat: walk up the interpreter's frames to the code that runs the tests, read
its verdict nonce and descriptor, write a pass and leave with a clean exit."""

import json
import os
import sys


def attack():
    frame = sys._getframe()
    while frame is not None:
        found = frame.f_locals
        if "nonce" in found and "verdict_fd" in found:
            line = f"{found['nonce']} {json.dumps({'status': 'pass', 'message': ''})}\n"
            os.write(found["verdict_fd"], line.encode())
            os._exit(0)
        frame = frame.f_back
    return "wrong"
