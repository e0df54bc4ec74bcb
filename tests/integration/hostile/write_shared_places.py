"""Write files into the host's shared writable places: /tmp, /var/tmp, /dev/shm,
/run/lock and $HOME. A sandbox's own private /tmp may take the write; the host's
must not see it."""

import os


def attack():
    wrote = []
    for folder in ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.path.expanduser("~")]:
        path = os.path.join(folder, "__MARKER__.txt")
        try:
            with open(path, "w") as f:
                f.write("escaped")
            wrote.append(folder)
        except OSError as exc:
            print("blocked:", path, exc)
    print("wrote in", wrote)
    host_only = {"/var/tmp", "/dev/shm", "/run/lock"}
    return "escaped" if host_only & set(wrote) else "contained"
