"""The relay's host side (see relay.py): sent as source over the channel and run by the host's
own `python3 -I -S` (Python 3.5+, standard library only: no f-strings, no variable
annotations). It speaks frames.py's format: reads Run and Cancel frames on stdin, writes one
Hello, then Output and Exit frames for each command.

Each command runs under `/bin/sh -c` (the same one parse as the host's login shell: the line
was built by container.py with one shlex.join), concurrently. A command given up (a Cancel, or
its deadline) and every command when stdin closes are cut off as a dropped channel would cut
them: their pipes are closed, they are not killed (a deploy transaction outlives its client on
purpose).
"""

import base64
import json
import os
import selectors
import subprocess
import sys
import threading
import time

VERSION = 2  # frames.VERSION (tests/unit/test_transport.py checks they agree)

_out = sys.stdout.buffer
_lock = threading.Lock()
_running = set()  # type: set[int]
_cancelled = set()  # type: set[int]


def send(doc):  # type: (dict[str, object]) -> None
    data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
    with _lock:
        try:
            _out.write(data)
            _out.flush()
        except OSError:
            pass


def output(rid, fd, data):  # type: (int, int, bytes) -> None
    send({"id": rid, "fd": fd, "data": base64.b64encode(data).decode()})


def feed(proc, data):  # type: (subprocess.Popen[bytes], bytes) -> None
    try:
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
    except (OSError, ValueError):
        pass


def given_up(rid, deadline):  # type: (int, float) -> bool
    return rid in _cancelled or time.monotonic() >= deadline


def run(req):  # type: (dict[str, object]) -> None
    rid = int(req["id"])  # type: ignore[call-overload]
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", str(req["command"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        _running.discard(rid)
        output(rid, 2, str(exc).encode())
        send({"id": rid, "exit": 127})
        return
    stdin = base64.b64decode(str(req["stdin"]))
    threading.Thread(target=feed, args=(proc, stdin), daemon=True).start()
    deadline = time.monotonic() + float(req["timeout"])  # type: ignore[arg-type]
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, 1)
    sel.register(proc.stderr, selectors.EVENT_READ, 2)
    try:
        while sel.get_map():
            if given_up(rid, deadline):
                return
            for key, _ in sel.select(0.2):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    output(rid, key.data, chunk)
                else:
                    sel.unregister(key.fileobj)
        while True:
            try:
                code = proc.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                if given_up(rid, deadline):
                    return
        send({"id": rid, "exit": code})
    finally:
        sel.close()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except (OSError, ValueError):
                pass
        _running.discard(rid)
        _cancelled.discard(rid)


def main():  # type: () -> None
    send({"hello": VERSION})
    for line in sys.stdin:
        req = json.loads(line)
        if "cancel" not in req:
            _running.add(req["id"])
            threading.Thread(target=run, args=(req,), daemon=True).start()
        elif req["cancel"] in _running:
            _cancelled.add(req["cancel"])
    os._exit(0)


if __name__ == "__main__":
    main()
