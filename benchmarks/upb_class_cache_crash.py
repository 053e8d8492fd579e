"""A reproduction, with protobuf alone, of a SIGSEGV in protobuf's upb Python extension (for an upstream report).

What it shows: a message class that upb made at run time for a sub-message of a descriptor pool of one's own is held
by upb's object cache without a strong reference. The class and its descriptor reference each other, so when the
messages of a parse die they are cyclic garbage. The cyclic collector's clear of such a class nulls the class's
descriptor, but upb removes the class from its cache only when the class is freed. If the same collection gives up
the GIL before that (here: freeing an mmap, which releases it), another thread's parse can take the half-cleared class
from the cache, and the next descriptor access dereferences NULL.

What it takes here: a message type used as a map's value (without one, or with text_format alone and no json_format
round trip, no trial crashed in this script's runs), one thread parsing and rendering, another collecting garbage
whose freeing gives up the GIL, and a short switch interval.

    python benchmarks/upb_class_cache_crash.py                  # dies of SIGSEGV, usually within a second
    python benchmarks/upb_class_cache_crash.py --keep-classes   # holds every class: runs to the end

Each trial is a fresh interpreter (the crash comes early in a process's life or, rarely, not at all); the script
prints each trial's exit status. Seen with protobuf 7.36.2 (upb), CPython 3.11.7, x86_64 Linux.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import mmap
import subprocess
import sys
import threading
import time

# One file, in a pool of its own: a top-level message with many sub-message types and a map of messages, as a
# server's config has.
_PARTS = 12
_SCHEMA = {
    "Leaf": [("value", 1, "double", True), ("name", 2, "string", False)],
    **{f"Part{i}": [("leaf", 1, "Leaf", True), ("note", 2, "string", False)] for i in range(_PARTS)},
    "Top": [(f"part{i}", i + 1, f"Part{i}", True) for i in range(_PARTS)] + [("labels", _PARTS + 1, "map", False)],
}
_TEXT = " ".join(f'part{i} {{ leaf [ {{ value: [1, 2] name: "a" }}, {{ value: 3 }} ] note: "n" }}' for i in range(_PARTS))
_TEXT += ' labels { key: "k" value { name: "v" } }'


def _top_class(keep_classes: bool) -> tuple[type, list[type]]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field_type = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="repro.proto", package="repro", syntax="proto3")
    top = None
    for name, fields in _SCHEMA.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number, label=field_type.LABEL_OPTIONAL)
            if kind == "map":
                entry = message.nested_type.add(name="LabelsEntry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=field_type.TYPE_STRING, label=field_type.LABEL_OPTIONAL)
                entry.field.add(
                    name="value", number=2, type=field_type.TYPE_MESSAGE, type_name=".repro.Leaf",
                    label=field_type.LABEL_OPTIONAL,
                )
                field.type, field.type_name = field_type.TYPE_MESSAGE, ".repro.Top.LabelsEntry"
                field.label = field_type.LABEL_REPEATED
            elif kind in _SCHEMA:
                field.type, field.type_name = field_type.TYPE_MESSAGE, f".repro.{kind}"
            else:
                field.type = field_type.TYPE_DOUBLE if kind == "double" else field_type.TYPE_STRING
            if repeated:
                field.label = field_type.LABEL_REPEATED
        if name == "Top":
            top = message
    assert top is not None
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    kept: list[type] = []
    if keep_classes:  # the workaround: a strong reference to every class of the pool, nested ones included
        pending = list(pool.FindFileByName("repro.proto").message_types_by_name.values())
        while pending:
            descriptor = pending.pop()
            kept.append(message_factory.GetMessageClass(descriptor))
            pending.extend(descriptor.nested_types)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("repro.Top")), kept


class _HoldsMapping:
    """Cyclic garbage whose freeing releases the GIL (mmap's dealloc unmaps with the GIL released)."""

    def __init__(self) -> None:
        self.me = self
        self.mapping = mmap.mmap(-1, 4096)


def _trial(seconds: float, keep_classes: bool) -> None:
    from google.protobuf import json_format, text_format

    faulthandler.enable()
    top, _kept = _top_class(keep_classes)
    sys.setswitchinterval(0.0002)  # frequent GIL hand-offs, as a server tuned for latency sets them
    gc.set_threshold(50_000, 20, 100)
    deadline = time.monotonic() + seconds

    def parse() -> None:
        while time.monotonic() < deadline:
            as_dict = json_format.MessageToDict(text_format.Parse(_TEXT, top()))
            json_format.ParseDict(as_dict, top())

    def collect() -> None:
        while time.monotonic() < deadline:
            garbage = [_HoldsMapping() for _ in range(300)]
            del garbage
            gc.collect()

    threads = [threading.Thread(target=parse), threading.Thread(target=collect)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-classes", action="store_true", help="hold a strong reference to every class")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one trial")
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        _trial(args.seconds, args.keep_classes)
        return
    import google.protobuf
    from google.protobuf.internal import api_implementation

    print(f"protobuf {google.protobuf.__version__} ({api_implementation.Type()}), Python {sys.version.split()[0]}")
    crashes = 0
    for number in range(args.trials):
        command = [sys.executable, __file__, "--trial", "--seconds", str(args.seconds)]
        if args.keep_classes:
            command.append("--keep-classes")
        started = time.monotonic()
        status = subprocess.run(command, capture_output=True).returncode
        crashes += status != 0
        verdict = "SIGSEGV" if status == -11 else f"exit {status}"
        print(f"trial {number + 1}: {verdict} after {time.monotonic() - started:.1f} s")
    print(f"{crashes} of {args.trials} trials crashed")


if __name__ == "__main__":
    main()
