"""Package one static binary as a one-layer OCI image archive that `ctr images import` takes: the pod sandbox
("pause") image of scripts/kube-local.sh, whose registry is out of reach here.

usage: kube_local_image.py BINARY OUT.tar NAME:TAG
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile


def digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def layer(binary: str) -> bytes:
    """An uncompressed tar of the binary as /pause, owned by root, with a fixed mtime (the same build, the same
    digest)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tar.gettarinfo(binary, arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime, info.mode = 0, 0o755
        with open(binary, "rb") as f:
            tar.addfile(info, f)
    return out.getvalue()


def main(binary: str, out: str, name: str) -> None:
    raw = layer(binary)
    packed = gzip.compress(raw, mtime=0)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        # the upstream pause image runs as 65535 too: it needs nothing but to exist
        "config": {"User": "65535:65535", "Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [digest(raw)]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(packed),
                    "size": len(packed)}],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest),
        "size": len(manifest),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}).encode()
    with tarfile.open(out, "w") as tar:
        for path, blob in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)] + [
                (f"blobs/sha256/{digest(b)[7:]}", b) for b in (packed, config, manifest)]:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(blob), 0o644
            tar.addfile(info, io.BytesIO(blob))
    print(out, name)


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
