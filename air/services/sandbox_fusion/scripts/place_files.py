"""Write a request's files that have absolute paths, run as the sandbox's unprivileged user (its agent uid): a path
it may not write fails here, with that user's rights, and nowhere else. Reads {path: base64} as JSON on stdin;
prints the first path it cannot write, with the reason, and exits 1."""

import base64
import json
import os
import sys

for path, content in json.load(sys.stdin).items():
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(base64.b64decode(content))
    except OSError as exc:
        print(f"file {path!r} cannot be written by the sandbox's user (uid {os.getuid()}): "
              f"{exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)
