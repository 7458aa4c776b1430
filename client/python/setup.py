"""Builds the `spex` Python package: the spex.v1 protobuf/gRPC stubs, the spex._native C
extension (atomics and futex wait/wake on the daemon's shared segments), the `spexrun`
launcher (console script; also `python -m spex.run`) and, as package data, the emulated-cluster
script (deploy/emulated_cluster.sh and its latency delayer, copied into spex/deploy/).

Install offline into Debian's Python (see README.md):
    /usr/bin/python3 -m venv --system-site-packages VENV
    VENV/bin/pip install --no-build-isolation client/python

The generated stubs (spex/proto/spex_pb2.py, spex_pb2_grpc.py) are shipped in the source tree,
so an install needs neither protoc nor the gRPC plugin; only a C compiler and Python's headers.
After changing proto/spex.proto, regenerate them with `python3 client/python/setup.py stubs`
(needs Debian's protobuf-compiler and protobuf-compiler-grpc); tests/python/stubs_test.sh fails
while they differ from what protoc makes of the proto. The proto is found at $SPEX_PROTO, else
../../proto/spex.proto (the source tree), else spex/proto/spex.proto (a copy shipped inside an
sdist). $PROTOC and $GRPC_PYTHON_PLUGIN override the tool paths.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Command, Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))


def find_proto():
    candidates = [
        os.environ.get("SPEX_PROTO", ""),
        os.path.join(HERE, "..", "..", "proto", "spex.proto"),
        os.path.join(HERE, "spex", "proto", "spex.proto"),
    ]
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    sys.exit("spex setup: cannot find spex.proto (looked at $SPEX_PROTO, "
             + ", ".join(os.path.abspath(c) for c in candidates[1:])
             + "); build from the spex source tree or set SPEX_PROTO")


def find_tool(env, name, package):
    path = os.environ.get(env) or shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if not path:
        sys.exit(f"spex setup: {name} not found; install Debian's {package} (deploy/setup.sh) or set ${env}")
    return path


def generate_stubs(out_dir):
    """Writes spex_pb2.py and spex_pb2_grpc.py into out_dir/spex/proto/ (importable as
    spex.proto.spex_pb2: the proto is compiled as spex/proto/spex.proto so the generated
    modules import each other through the package)."""
    proto = find_proto()
    protoc = find_tool("PROTOC", "protoc", "protobuf-compiler")
    plugin = find_tool("GRPC_PYTHON_PLUGIN", "grpc_python_plugin", "protobuf-compiler-grpc")
    with tempfile.TemporaryDirectory() as tmp:
        src_dir = os.path.join(tmp, "spex", "proto")
        os.makedirs(src_dir)
        shutil.copyfile(proto, os.path.join(src_dir, "spex.proto"))
        dest = os.path.join(out_dir, "spex", "proto")
        os.makedirs(dest, exist_ok=True)
        cmd = [protoc, "-I", tmp, f"--python_out={out_dir}", f"--grpc_out={out_dir}",
               f"--plugin=protoc-gen-grpc={plugin}", "spex/proto/spex.proto"]
        print("spex setup: " + " ".join(cmd))
        subprocess.run(cmd, check=True)
        for name in ("spex_pb2.py", "spex_pb2_grpc.py"):
            if not os.path.isfile(os.path.join(dest, name)):
                sys.exit(f"spex setup: protoc did not write {name}")


STUBS = ("spex_pb2.py", "spex_pb2_grpc.py")

# The emulated-cluster script and the latency delayer it builds (deploy/emulated_cluster.sh,
# deploy/emulated/nfq_delay.c) ship inside the package as spex/deploy/..., so spex.emulated never
# looks into a checkout. Taken from the source tree (../../deploy), else from the copy an sdist
# carries (spex/deploy).
DEPLOY_FILES = ("emulated_cluster.sh", os.path.join("emulated", "nfq_delay.c"))


def find_deploy_file(name):
    for base in (os.path.join(HERE, "..", "..", "deploy"), os.path.join(HERE, "spex", "deploy")):
        path = os.path.join(base, name)
        if os.path.isfile(path):
            return os.path.abspath(path)
    return None


def copy_deploy_files(package_dir):
    """Copies DEPLOY_FILES into package_dir/deploy/ (the script keeps its mode); says which are
    missing (spex.emulated then needs $SPEX_EMULATED_CLUSTER)."""
    for name in DEPLOY_FILES:
        src = find_deploy_file(name)
        if src is None:
            print(f"spex setup: deploy/{name} not found beside client/python; spex.emulated will need "
                  "$SPEX_EMULATED_CLUSTER")
            continue
        dest = os.path.join(package_dir, "deploy", name)
        if os.path.abspath(dest) == src:
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(src, dest)


def shipped_stubs():
    return all(os.path.isfile(os.path.join(HERE, "spex", "proto", n)) for n in STUBS)


class BuildPyWithStubs(build_py):
    """build_py that generates the gRPC stubs into the build directory only when the source tree
    does not ship them (the shipped ones are package files and are copied like the rest)."""

    def run(self):
        super().run()
        if not shipped_stubs():
            generate_stubs(self.build_lib)
        copy_deploy_files(os.path.join(self.build_lib, "spex"))


class Stubs(Command):
    """`python3 setup.py stubs`: regenerates the shipped stubs from proto/spex.proto."""

    description = "regenerate spex/proto/spex_pb2*.py from proto/spex.proto"
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        generate_stubs(HERE)


class SdistWithProto(sdist):
    """sdist that ships a copy of spex.proto inside the package, so it builds elsewhere."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = os.path.join(base_dir, "spex", "proto", "spex.proto")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(find_proto(), dest)
        copy_deploy_files(os.path.join(base_dir, "spex"))


setup(
    name="spex",
    version="0.1.0",
    description="Python client and PyTorch DDP communication hook for spexd (sparse gradient exchange)",
    packages=["spex", "spex.proto"],
    ext_modules=[
        Extension("spex._native", sources=["spex/_native.c"], extra_compile_args=["-O2", "-std=c11", "-Wall"])
    ],
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto, "stubs": Stubs},
    entry_points={"console_scripts": ["spexrun=spex.run:main"]},
    python_requires=">=3.9",
    install_requires=["grpcio", "protobuf", "numpy"],
    extras_require={"torch": ["torch"]},
)
