# Finds every dependency and exposes it as an imported target with sane properties.
# The libraries (MPI, HDF5, libtorch, Kokkos, toml++, JSON, zlib, PCRE2, ICU): the same file the
# installed CMake package uses (shardtrainConfig.cmake).
include(shardtrainFindDependencies)
# CLI11: the binary's command line only (not a dependency of the layers, nor of the package).
find_package(CLI11 QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(CLI11_INCLUDE CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CLI11_INCLUDE})
endif()
# The C++ standard follows the libtorch found: its headers refuse C++17 from 2.14 on ("C++20 or
# later compatible compiler is required to use ATen"; PyTorch's release notes: 2.13 builds as
# C++17, 2.14 needs C++20). Older ones keep C++17, the standard the code is tested in here.
# SHARDTRAIN_CXX_STANDARD overrides the choice (e.g. to try C++20 with libtorch 1.13).
set(SHARDTRAIN_CXX_STANDARD "" CACHE STRING "C++ standard (17 or 20); empty: chosen by the libtorch version")
if(SHARDTRAIN_CXX_STANDARD)
  set(CMAKE_CXX_STANDARD ${SHARDTRAIN_CXX_STANDARD})
elseif(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
  set(CMAKE_CXX_STANDARD 20)
else()
  set(CMAKE_CXX_STANDARD 17)
endif()
message(STATUS "shardtrain: C++${CMAKE_CXX_STANDARD} for libtorch ${Torch_VERSION}")
# A libtorch built with CUDA (a PyTorch wheel's) defines C10_CUDA_LIBRARY / TORCH_CUDA_LIBRARIES;
# then the engine's CUDA paths (src/fsdp/device.cpp: c10::cuda streams, allocator statistics)
# are compiled in. Debian's libtorch is CPU-only.
set(SHARDTRAIN_TORCH_CUDA OFF)
if(C10_CUDA_LIBRARY OR TORCH_CUDA_LIBRARIES)
  set(SHARDTRAIN_TORCH_CUDA ON)
endif()

# CUDA / NCCL: AUTO turns them on when present, so CI always compiles the NCCL backend.
set(SHARDTRAIN_HAVE_CUDA OFF)
set(SHARDTRAIN_HAVE_NCCL OFF)
if(NOT SHARDTRAIN_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(SHARDTRAIN_HAVE_CUDA ON)
  elseif(SHARDTRAIN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDTRAIN_WITH_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
# Our own CUDA kernels (the device AdamW) need a CUDA compiler; without one (a GPU machine with
# only a PyTorch wheel) the optimizer falls back to libtorch operations on the device.
set(SHARDTRAIN_HAVE_CUDA_KERNELS OFF)
if(SHARDTRAIN_HAVE_CUDA AND NOT SHARDTRAIN_WITH_CUDA_KERNELS STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # H200/H100 machine code plus portable PTX (the oldest architecture CUDA 13 still targets),
    # which the driver compiles for any newer GPU.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90-real;75-virtual")
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    set(SHARDTRAIN_HAVE_CUDA_KERNELS ON)
  elseif(SHARDTRAIN_WITH_CUDA_KERNELS STREQUAL "ON")
    message(FATAL_ERROR "SHARDTRAIN_WITH_CUDA_KERNELS=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(SHARDTRAIN_HAVE_CUDA AND NOT SHARDTRAIN_WITH_NCCL STREQUAL "OFF")
  find_package(NCCL QUIET)
  if(NCCL_FOUND)
    set(SHARDTRAIN_HAVE_NCCL ON)
  elseif(SHARDTRAIN_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "SHARDTRAIN_WITH_NCCL=ON but NCCL was not found (set NCCL_ROOT)")
  endif()
endif()
