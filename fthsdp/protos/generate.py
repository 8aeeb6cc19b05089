"""Regenerate the Python stubs of the .proto files under fthsdp/protos/.

The generated modules are committed so that a plain ``pip install`` from a
fresh clone can import them without grpcio-tools; tests/test_protos.py
regenerates them into a temporary folder and fails if the committed copies are
stale. Run ``python -m fthsdp.protos.generate`` after editing a .proto file.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PROTO_FILES = ("fthsdp/protos/v1/coordinator.proto", "fthsdp/protos/v1/catchup.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Run protoc (from grpcio-tools) and return the files it wrote.

    Paths are given relative to the repository root so that the generated
    modules import each other as ``fthsdp.protos.v1...``.
    """
    import importlib.resources

    from grpc_tools import protoc  # dev-only dependency

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written: list[pathlib.Path] = []
    for proto in PROTO_FILES:
        stem = proto.removesuffix(".proto")
        written.extend(out_dir / f"{stem}{suffix}" for suffix in GENERATED_SUFFIXES)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT, help="output root (default: the repository)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
