"""What CMakeLists.txt needs of the installed torch, one item per line.

torch's own CMake package (find_package(Torch)) requires the CUDA toolkit whenever torch is a
CUDA build, as PyPI's x86-64 wheels of torch 2.14 and 2.15 are; this backend uses only the
CPU libraries, so the build takes from the installed package: its version, its directory, its
C++ ABI, and the compile definitions its torch_cpu library exports (the layout of the c10d
headers depends on them), read from torch's exported CMake targets.
"""

import os
import re

import torch

package = os.path.dirname(torch.__file__)
with open(os.path.join(package, "share", "cmake", "Caffe2", "Caffe2Targets.cmake")) as f:
    targets = f.read()
torch_cpu = re.search(r"set_target_properties\(torch_cpu PROPERTIES(.*?)\n\)", targets, re.S)
if torch_cpu is None:
    raise SystemExit(f"torch {torch.__version__}: no torch_cpu target in {f.name}")
definitions = re.search(r'INTERFACE_COMPILE_DEFINITIONS "([^"]*)"', torch_cpu.group(1))
print(torch.__version__)
print(package)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(definitions.group(1).replace(";", ",") if definitions else "")
