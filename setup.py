"""Build the CPU likelihood kernel (an XLA FFI library) with the package; everything else is in pyproject.toml.

`pip install .` / `pip install -e .` compile `jaxphylo/likelihood/kernels/cpp/peeling.cc`
(C++17, the XLA FFI headers shipped with jaxlib) into
`jaxphylo/likelihood/kernels/cpp/_peeling_ffi*.so`, loaded at run time with ctypes by
`jaxphylo.likelihood.kernels._cpu`. The code is built for the baseline
instruction set with an AVX2 + FMA copy of the kernels picked at run time, so
a wheel runs on any x86-64 CPU. The extension is optional: if it cannot be
built, installation goes on and the kernel reports itself unavailable.

    python setup.py build_ext --inplace    # a development build in the source tree
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def ffi_include_dir() -> str:
    """The XLA FFI headers of the jaxlib installed in the build environment."""
    try:
        import jax.ffi

        return jax.ffi.include_dir()
    except (ImportError, AttributeError):
        import jaxlib

        return os.path.join(os.path.dirname(jaxlib.__file__), "include")


class BuildExt(build_ext):
    """C++17 with -O3; the headers are looked up only when the extension is built."""

    def build_extensions(self):
        for extension in self.extensions:
            extension.include_dirs.append(ffi_include_dir())
            if self.compiler.compiler_type == "msvc":
                extension.extra_compile_args = ["/std:c++17", "/O2"]
            else:
                extension.extra_compile_args = ["-std=c++17", "-O3", "-fvisibility=hidden", "-Wno-psabi",
                                                "-DNDEBUG"]
                if sys.platform != "darwin":
                    extension.extra_link_args = ["-pthread"]
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "jaxphylo.likelihood.kernels.cpp._peeling_ffi",
            sources=["jaxphylo/likelihood/kernels/cpp/peeling.cc"],
            depends=["jaxphylo/likelihood/kernels/cpp/kernels.inc"],
            language="c++",
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
