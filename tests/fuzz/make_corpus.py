#!/usr/bin/env python3
# Writes the seed corpus of wire_fuzz (tests/fuzz/corpus/): one file per well-formed input, so
# that the fuzzer starts from frames and handshakes that get far into the decoders.
import os, struct
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
u64 = lambda *v: b"".join(struct.pack("<Q", x) for x in v)
frame = lambda t, tag, payload: u64(t, tag, len(payload)) + payload
DATA, ABORT, GOODBYE, HEARTBEAT = 1, 2, 3, 4
seeds = {
    "data_match": b"\0" + frame(DATA, 7, bytes(range(64))) + frame(DATA, 8, b"x" * 16),
    "data_then_goodbye": b"\0" + frame(HEARTBEAT, 0, b"") + frame(DATA, 7, b"\1" * 64) + frame(GOODBYE, 0, b""),
    "unexpected_then_match": b"\0" + frame(DATA, 9, b"u" * 100) + frame(DATA, 7, b"\2" * 64),
    "parked": b"\0" + frame(DATA, 9, b"p" * 300) + frame(DATA, 7, b"\3" * 64),
    "oversize": b"\0" + u64(DATA, 5, 1 << 33),
    "wrong_size": b"\0" + frame(DATA, 7, b"s" * 10),
    "abort": b"\0" + frame(ABORT, 3, b"peer says\n\x1b[2Kno"),
    "goodbye": b"\0" + frame(GOODBYE, 0, b""),
    "hello": b"\1" + u64(0x32305355524F4843, 1, 4, 5000, 9) + b"m" * 32 + b"127.0.0.1",
    "mesh": b"\1" + u64(0x32304853454D4843, 2) + b"m" * 32,
    "challenge": b"\1" + u64(0x32304C4148434843) + b"n" * 16,
    "table": b"\1\x01" + u64(5000, 9) + b"127.0.0.1" + u64(5001, 3) + b"::1",
}
for name, data in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
