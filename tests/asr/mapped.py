"""Which files a tensor's memory is mapped from (Linux's /proc/self/maps), for the tests of mapped loads."""

from __future__ import annotations


def mapped_files(address: int) -> set[str]:
    """The files whose mapping in this process holds ``address``."""
    found = set()
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high and len(fields) == 6:
                found.add(fields[5].strip())
    return found
