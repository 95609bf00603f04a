# The libraries the shardtrain layers link, found and made into imported targets: one file for
# the build (included by cmake/Dependencies.cmake) and for the installed CMake package (included
# by shardtrainConfig.cmake, where each search is a find_dependency). Defines shardtrain::hdf5,
# shardtrain::torch and a Kokkos::kokkos, tomlplusplus::tomlplusplus, PkgConfig::PCRE2 that work.
if(SHARDTRAIN_FIND_FOR_PACKAGE)
  include(CMakeFindDependencyMacro)
  macro(shardtrain_find_dep)
    find_dependency(${ARGV})
  endmacro()
else()
  macro(shardtrain_find_dep)
    find_package(${ARGV} REQUIRED)
  endmacro()
endif()

# MPI's C component needs the C language, which a C++-only project using the package has not
# enabled; MPI::MPI_CXX carries the C library too, so the C++ component is all the layers need.
shardtrain_find_dep(MPI COMPONENTS CXX)
shardtrain_find_dep(Threads)

# Parallel HDF5 (Debian: libhdf5-openmpi-dev). Prefer the MPI flavour explicitly.
set(HDF5_PREFER_PARALLEL ON)
if(EXISTS /usr/lib/x86_64-linux-gnu/hdf5/openmpi AND NOT HDF5_ROOT)
  set(HDF5_ROOT /usr/lib/x86_64-linux-gnu/hdf5/openmpi)
endif()
if(SHARDTRAIN_FIND_FOR_PACKAGE AND SHARDTRAIN_BUILT_HDF5_LIBRARIES)
  # The package takes the parallel HDF5 the layers were built against (shardtrainConfig.cmake
  # records it): FindHDF5 test-compiles a C file, which a C++-only project cannot do.
  foreach(_st_path IN LISTS SHARDTRAIN_BUILT_HDF5_INCLUDE_DIRS SHARDTRAIN_BUILT_HDF5_LIBRARIES)
    if(IS_ABSOLUTE "${_st_path}" AND NOT EXISTS "${_st_path}")
      set(shardtrain_FOUND FALSE)
      set(shardtrain_NOT_FOUND_MESSAGE "the parallel HDF5 shardtrain was built with is gone: ${_st_path}")
      return()
    endif()
  endforeach()
  set(HDF5_C_INCLUDE_DIRS ${SHARDTRAIN_BUILT_HDF5_INCLUDE_DIRS})
  set(HDF5_C_LIBRARIES ${SHARDTRAIN_BUILT_HDF5_LIBRARIES})
  set(HDF5_DEFINITIONS ${SHARDTRAIN_BUILT_HDF5_DEFINITIONS})
else()
  shardtrain_find_dep(HDF5 COMPONENTS C)
  if(NOT HDF5_IS_PARALLEL)
    message(FATAL_ERROR "shardtrain needs a parallel (MPI) HDF5; found a serial one at ${HDF5_INCLUDE_DIRS}")
  endif()
endif()
if(NOT TARGET shardtrain::hdf5)
  add_library(shardtrain::hdf5 INTERFACE IMPORTED GLOBAL)
  target_include_directories(shardtrain::hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(shardtrain::hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_CXX)
  target_compile_definitions(shardtrain::hdf5 INTERFACE ${HDF5_DEFINITIONS})
endif()

# libtorch: Debian's CPU 1.13 by default, any 2.x with -DTorch_DIR=...
shardtrain_find_dep(Torch)
if(NOT TARGET shardtrain::torch)
  add_library(shardtrain::torch INTERFACE IMPORTED GLOBAL)
  target_link_libraries(shardtrain::torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(shardtrain::torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
endif()

# Kokkos: Debian's target points at /usr/lib/include; the headers live beside Trilinos'.
shardtrain_find_dep(Kokkos)
find_path(SHARDTRAIN_KOKKOS_INCLUDE Kokkos_Core.hpp PATHS /usr/include/trilinos ${Kokkos_DIR}/../../../include NO_DEFAULT_PATH)
if(NOT SHARDTRAIN_KOKKOS_INCLUDE)
  find_path(SHARDTRAIN_KOKKOS_INCLUDE Kokkos_Core.hpp PATH_SUFFIXES trilinos REQUIRED)
endif()
set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${SHARDTRAIN_KOKKOS_INCLUDE}")

find_package(tomlplusplus QUIET)
if(NOT TARGET tomlplusplus::tomlplusplus)
  find_path(TOMLPP_INCLUDE toml++/toml.h REQUIRED)
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED GLOBAL)
  set_target_properties(tomlplusplus::tomlplusplus PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${TOMLPP_INCLUDE})
endif()
shardtrain_find_dep(nlohmann_json)

# The data layer: zlib (R lazy-load files), PCRE2 for tokenizer.json split patterns, ICU for their
# Unicode normalizers (Debian zlib1g-dev, libpcre2-dev, libicu-dev).
shardtrain_find_dep(ZLIB)
shardtrain_find_dep(PkgConfig)
if(NOT TARGET PkgConfig::PCRE2)
  pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET GLOBAL libpcre2-8)
endif()
shardtrain_find_dep(ICU COMPONENTS uc)
