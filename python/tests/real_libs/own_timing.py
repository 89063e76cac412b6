"""The scenario scripts' own clock: each records time.time() after every step it does, in plain
code that does not touch kace, and writes the list to $KACE_TEST_OWN_TIMES at exit. The test
compares the rate kace's reader computes from the progress file with this one."""

import atexit
import json
import os
import time

times = []


def mark():
    times.append(time.time())


def _save():
    path = os.environ.get("KACE_TEST_OWN_TIMES")
    if path and times:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "times": times}) + "\n")


atexit.register(_save)
