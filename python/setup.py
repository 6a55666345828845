"""Builds xagg_torch: the "xagg" torch.distributed backend (docs/pytorch.md).

It links libxagg from a CMake build of this repository:

    cmake -S . -B build && cmake --build build --target xagg_worker
    cd python && XAGG_BUILD_DIR=../build /usr/bin/python3 setup.py build_ext --inplace
"""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
repository = os.path.dirname(here)
build = os.path.abspath(os.environ.get("XAGG_BUILD_DIR", os.path.join(repository, "build")))

setup(
    name="xagg_torch",
    version="0.1",
    packages=["xagg_torch"],
    ext_modules=[
        CppExtension(
            "xagg_torch._C",
            ["xagg_torch/csrc/process_group.cpp"],
            include_dirs=[os.path.join(repository, "include")],
            extra_compile_args=["-std=c++17", "-O2"],
            # As libxagg is built (spdlog's CMake package): one spdlog, whose
            # registry and so log level the module shares with libxagg.
            define_macros=[("SPDLOG_COMPILED_LIB", None), ("SPDLOG_SHARED_LIB", None), ("SPDLOG_FMT_EXTERNAL", None)],
            # libxagg and what it needs; the static libraries are built position-independent.
            extra_objects=[
                os.path.join(build, "src/worker/libxagg_worker.a"),
                os.path.join(build, "src/common/libxagg_common.a"),
            ],
            libraries=["spdlog", "fmt", "crypto"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
