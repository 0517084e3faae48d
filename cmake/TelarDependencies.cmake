# Finds what Telar's headers need. Included by the top-level CMakeLists.txt and
# by the installed TelarConfig.cmake, so a project using Telar sees the same
# dependencies Telar was configured with.
#
# Inputs (cache options or variables): TELAR_ENABLE_KOKKOSKERNELS,
# TELAR_ENABLE_ONEDNN, TELAR_ENABLE_CUBLAS, TELAR_ENABLE_ONNX,
# TELAR_ENABLE_HDF5 (ON, OFF or AUTO).
# Outputs: TELAR_HAVE_KOKKOSKERNELS, TELAR_HAVE_ONEDNN, TELAR_HAVE_CUBLAS,
# TELAR_HAVE_ONNX, TELAR_HAVE_HDF5 and the targets Kokkos::kokkos,
# MPI::MPI_CXX, ZLIB::ZLIB, [Kokkos::kokkoskernels], [Telar::dnnl],
# [CUDA::cublas], [Telar::onnx], [Telar::hdf5].

include(CMakeFindDependencyMacro)

# Debian's Kokkos config rejects CXX extensions; say so up front instead of
# letting it print a warning and force the cache.
if(NOT DEFINED CMAKE_CXX_EXTENSIONS)
  set(CMAKE_CXX_EXTENSIONS OFF)
endif()

find_dependency(Kokkos)

# --- Debian/Trilinos Kokkos 3.4 workaround --------------------------------
# Debian ships Kokkos inside Trilinos (libtrilinos-kokkos-dev). Its generated
# Kokkos::kokkos target points INTERFACE_INCLUDE_DIRECTORIES at
# <prefix>/lib/include (a path computed one level too shallow), while the
# headers live in <prefix>/include/trilinos, which the same config reports
# correctly in Kokkos_INCLUDE_DIRS. Its Kokkos Kernels config defines no
# Kokkos::kokkoskernels target at all, only trilinos_kokkoskernels without
# include directories. We repair both here, only when the include directory
# is missing, so a correct Kokkos 4.x installation is left untouched.
if(TARGET Kokkos::kokkos)
  get_target_property(_telar_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_telar_kokkos_broken FALSE)
  foreach(_dir IN LISTS _telar_kokkos_inc)
    if(NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}")
      set(_telar_kokkos_broken TRUE)
    endif()
  endforeach()
  if(_telar_kokkos_broken AND Kokkos_INCLUDE_DIRS)
    message(STATUS "Telar: repairing Kokkos::kokkos include directories "
                   "(${_telar_kokkos_inc} -> ${Kokkos_INCLUDE_DIRS})")
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS}")
  endif()
endif()
# --------------------------------------------------------------------------

set(TELAR_HAVE_KOKKOSKERNELS OFF)
if(NOT TELAR_ENABLE_KOKKOSKERNELS STREQUAL "OFF")
  set(_telar_trilinos_kokkos FALSE)
  if(TARGET trilinos_kokkoscore)
    set(_telar_trilinos_kokkos TRUE)
  endif()
  find_package(KokkosKernels QUIET)
  # Kokkos Kernels must come from the same release as Kokkos: Debian's
  # Trilinos copy (no version file) only goes with Debian's Kokkos.
  if(KokkosKernels_FOUND AND TARGET trilinos_kokkoskernels AND NOT _telar_trilinos_kokkos)
    message(STATUS "Telar: ignoring Trilinos' Kokkos Kernels, which does not match "
                   "Kokkos ${Kokkos_VERSION}")
    set(KokkosKernels_FOUND FALSE)
  elseif(KokkosKernels_FOUND AND KokkosKernels_VERSION AND Kokkos_VERSION)
    string(REGEX MATCH "^[0-9]+" _telar_kk_major "${KokkosKernels_VERSION}")
    string(REGEX MATCH "^[0-9]+" _telar_k_major "${Kokkos_VERSION}")
    if(NOT _telar_kk_major STREQUAL _telar_k_major)
      message(STATUS "Telar: ignoring Kokkos Kernels ${KokkosKernels_VERSION}, which does not "
                     "match Kokkos ${Kokkos_VERSION}")
      set(KokkosKernels_FOUND FALSE)
    endif()
  endif()
  if(KokkosKernels_FOUND)
    if(NOT TARGET Kokkos::kokkoskernels AND TARGET trilinos_kokkoskernels)
      # Trilinos flavour (see above): wrap the library in the usual name.
      add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
      set_target_properties(Kokkos::kokkoskernels PROPERTIES
        INTERFACE_LINK_LIBRARIES "trilinos_kokkoskernels;Kokkos::kokkos"
        INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS}")
    endif()
    if(TARGET Kokkos::kokkoskernels)
      set(TELAR_HAVE_KOKKOSKERNELS ON)
    endif()
  endif()
  if(TELAR_ENABLE_KOKKOSKERNELS STREQUAL "ON" AND NOT TELAR_HAVE_KOKKOSKERNELS)
    message(FATAL_ERROR "Telar: TELAR_ENABLE_KOKKOSKERNELS=ON but Kokkos Kernels "
                        "was not found (set KokkosKernels_ROOT)")
  endif()
endif()

# cuBLAS for telar::Bf16Gemm in CUDA memory (core/detail/cublas_bf16_gemm.hpp):
# looked for only when Kokkos has CUDA.
set(TELAR_HAVE_CUBLAS OFF)
if("CUDA" IN_LIST Kokkos_DEVICES AND NOT TELAR_ENABLE_CUBLAS STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(TARGET CUDA::cublas)
    set(TELAR_HAVE_CUBLAS ON)
  elseif(TELAR_ENABLE_CUBLAS STREQUAL "ON")
    message(FATAL_ERROR "Telar: TELAR_ENABLE_CUBLAS=ON but cuBLAS was not found "
                        "(set CUDAToolkit_ROOT)")
  endif()
endif()

# oneDNN's own CMake config drags in OpenCL; Telar only calls its C sgemm, so
# a plain library + header look-up is enough and works on more systems.
set(TELAR_HAVE_ONEDNN OFF)
if(NOT TELAR_ENABLE_ONEDNN STREQUAL "OFF")
  find_path(TELAR_DNNL_INCLUDE_DIR dnnl.h)
  find_library(TELAR_DNNL_LIBRARY dnnl)
  if(TELAR_DNNL_INCLUDE_DIR AND TELAR_DNNL_LIBRARY)
    if(NOT TARGET Telar::dnnl)
      add_library(Telar::dnnl UNKNOWN IMPORTED)
      set_target_properties(Telar::dnnl PROPERTIES
        IMPORTED_LOCATION "${TELAR_DNNL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${TELAR_DNNL_INCLUDE_DIR}")
    endif()
    set(TELAR_HAVE_ONEDNN ON)
  elseif(TELAR_ENABLE_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "Telar: TELAR_ENABLE_ONEDNN=ON but dnnl.h/libdnnl were "
                        "not found (Debian: libdnnl-dev)")
  endif()
endif()

# ONNX import/export (telar/onnx/*.hpp): Debian's libonnx-dev and protobuf.
# Only code that includes those headers links Telar::onnx.
set(TELAR_HAVE_ONNX OFF)
if(NOT TELAR_ENABLE_ONNX STREQUAL "OFF")
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND OR TARGET protobuf::libprotobuf)
    find_package(ONNX QUIET)
  endif()
  # ONNX 1.16 and later export ONNX::onnx_proto (Debian 13: 1.17), 1.12
  # (Debian 12) a plain onnx_proto.
  set(_telar_onnx_proto "")
  foreach(_telar_t ONNX::onnx_proto onnx_proto)
    if(NOT _telar_onnx_proto AND TARGET ${_telar_t})
      set(_telar_onnx_proto ${_telar_t})
    endif()
  endforeach()
  if(_telar_onnx_proto AND TARGET protobuf::libprotobuf)
    if(NOT TARGET Telar::onnx)
      # GLOBAL: a project that add_subdirectory()s Telar links Telar::onnx
      # from its own directories, where a directory-scoped imported target
      # (and the ONNX and protobuf targets behind it) would not be visible.
      add_library(Telar::onnx INTERFACE IMPORTED GLOBAL)
      set_target_properties(Telar::onnx PROPERTIES INTERFACE_LINK_LIBRARIES
                                                   "${_telar_onnx_proto}")
      foreach(_telar_t ${_telar_onnx_proto} onnx ONNX::onnx protobuf::libprotobuf)
        if(TARGET ${_telar_t})
          get_target_property(_telar_imported ${_telar_t} IMPORTED)
          get_target_property(_telar_global ${_telar_t} IMPORTED_GLOBAL)
          if(_telar_imported AND NOT _telar_global)
            set_target_properties(${_telar_t} PROPERTIES IMPORTED_GLOBAL TRUE)
          endif()
        endif()
      endforeach()
    endif()
    set(TELAR_HAVE_ONNX ON)
  elseif(TELAR_ENABLE_ONNX STREQUAL "ON")
    message(FATAL_ERROR "Telar: TELAR_ENABLE_ONNX=ON but ONNX or Protobuf was not found "
                        "(Debian: libonnx-dev libprotobuf-dev)")
  endif()
endif()

find_dependency(MPI COMPONENTS CXX)
find_dependency(ZLIB)

# Parallel HDF5 for checkpoints (telar/io/checkpoint.hpp): it must be built
# against the MPI in use. Debian installs one per MPI flavour
# (/usr/lib/<arch>/hdf5/{openmpi,mpich}, h5pcc.{openmpi,mpich}); pick the
# flavour's compiler wrapper unless the user pointed HDF5_ROOT or
# HDF5_C_COMPILER_EXECUTABLE elsewhere.
set(TELAR_HAVE_HDF5 OFF)
if(NOT DEFINED TELAR_ENABLE_HDF5)
  set(TELAR_ENABLE_HDF5 AUTO)
endif()
if(NOT TELAR_ENABLE_HDF5 STREQUAL "OFF")
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_LIBRARIES MPI::MPI_CXX)
  check_cxx_source_compiles("#include <mpi.h>
#ifndef OPEN_MPI
#error not Open MPI
#endif
int main() { return 0; }" TELAR_MPI_IS_OPEN_MPI)
  check_cxx_source_compiles("#include <mpi.h>
#ifndef MPICH_VERSION
#error not MPICH
#endif
int main() { return 0; }" TELAR_MPI_IS_MPICH)
  unset(CMAKE_REQUIRED_LIBRARIES)
  set(_telar_h5_flavour "")
  if(TELAR_MPI_IS_OPEN_MPI)
    set(_telar_h5_flavour openmpi)
  elseif(TELAR_MPI_IS_MPICH)
    set(_telar_h5_flavour mpich)
  endif()
  if(_telar_h5_flavour AND NOT HDF5_ROOT AND NOT HDF5_C_COMPILER_EXECUTABLE)
    find_program(TELAR_H5PCC NAMES h5pcc.${_telar_h5_flavour})
    if(TELAR_H5PCC)
      set(HDF5_C_COMPILER_EXECUTABLE ${TELAR_H5PCC})
    endif()
  endif()
  # FindHDF5 probes with the C compiler.
  get_property(_telar_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "C" IN_LIST _telar_languages)
    enable_language(C)
  endif()
  set(HDF5_PREFER_PARALLEL TRUE)
  find_package(HDF5 QUIET COMPONENTS C)
  if(HDF5_FOUND AND HDF5_IS_PARALLEL)
    if(NOT TARGET Telar::hdf5)
      add_library(Telar::hdf5 INTERFACE IMPORTED)
      set_target_properties(Telar::hdf5 PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${HDF5_C_INCLUDE_DIRS}"
        INTERFACE_LINK_LIBRARIES "${HDF5_C_LIBRARIES};MPI::MPI_CXX"
        INTERFACE_COMPILE_DEFINITIONS "${HDF5_C_DEFINITIONS}")
    endif()
    set(TELAR_HAVE_HDF5 ON)
  elseif(TELAR_ENABLE_HDF5 STREQUAL "ON")
    message(FATAL_ERROR "Telar: TELAR_ENABLE_HDF5=ON but no parallel HDF5 matching this MPI "
                        "was found (Debian: libhdf5-openmpi-dev or libhdf5-mpich-dev; or set "
                        "HDF5_ROOT)")
  elseif(HDF5_FOUND)
    message(STATUS "Telar: HDF5 ${HDF5_VERSION} is not parallel; checkpoints disabled")
  endif()
endif()
