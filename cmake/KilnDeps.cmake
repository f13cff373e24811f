# Finds kiln's dependencies, all from Debian. A missing one stops configuration with the package name.
function(kiln_require found pkg what)
  if(NOT ${found})
    message(FATAL_ERROR "kiln needs ${what}: install the Debian package '${pkg}' "
                        "(sudo apt-get install ${pkg}, or run scripts/setup.sh)")
  endif()
endfunction()

# KILN_DEPS_ROOT: a tree laid out like / that holds these libraries (scripts/gpu_kit.sh packs one from
# this machine's packages for GPU machines whose image lacks them); searched before the system.
set(KILN_DEPS_ROOT "" CACHE PATH "A tree laid out like / holding kiln's dependencies (scripts/gpu_kit.sh); empty: the system's")
if(KILN_DEPS_ROOT)
  list(PREPEND CMAKE_PREFIX_PATH ${KILN_DEPS_ROOT}/usr)
endif()

find_package(fmt CONFIG QUIET)
kiln_require(fmt_FOUND libfmt-dev "the fmt library")

find_package(OpenMP QUIET COMPONENTS CXX)
kiln_require(OpenMP_CXX_FOUND libgomp1 "OpenMP (comes with g++)")

# OpenBLAS, OpenMP flavour (one thread pool shared with kiln's own loops).
set(KILN_OPENBLAS_DIR "${KILN_DEPS_ROOT}/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
find_library(KILN_OPENBLAS_LIB NAMES libopenblas.so.0 openblas PATHS ${KILN_OPENBLAS_DIR} NO_DEFAULT_PATH)
kiln_require(KILN_OPENBLAS_LIB libopenblas0-openmp "OpenBLAS built with OpenMP")
find_path(KILN_CBLAS_INCLUDE NAMES cblas.h PATHS ${KILN_DEPS_ROOT}/usr/include/${CMAKE_LIBRARY_ARCHITECTURE} /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}
          /usr/include)
kiln_require(KILN_CBLAS_INCLUDE libopenblas-dev "the CBLAS header")
# kiln::openblas: an imported target, so that a static libkiln's exported link interface can name it
# (kilnConfig.cmake defines it again on the user's side).
if(NOT TARGET kiln::openblas)
  add_library(kiln::openblas UNKNOWN IMPORTED GLOBAL)
  set_target_properties(kiln::openblas PROPERTIES IMPORTED_LOCATION ${KILN_OPENBLAS_LIB}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${KILN_CBLAS_INCLUDE})
endif()

if(KILN_WITH_ONEDNN)
  find_package(OpenCL QUIET)  # dnnl's exported target names OpenCL::OpenCL
  if(NOT TARGET OpenCL::OpenCL)
    add_library(OpenCL::OpenCL INTERFACE IMPORTED)
  endif()
  find_package(dnnl CONFIG QUIET)
  kiln_require(dnnl_FOUND libdnnl-dev "oneDNN (or configure with -DKILN_WITH_ONEDNN=OFF)")
endif()

if(KILN_BUILD_TESTS)
  find_path(KILN_CATCH2_INCLUDE NAMES catch2/catch.hpp)
  kiln_require(KILN_CATCH2_INCLUDE catch2 "Catch2 v2 (single header)")
endif()
if(KILN_BUILD_BENCH AND KILN_BUILD_BENCH_CPU)
  find_package(benchmark CONFIG QUIET)
  kiln_require(benchmark_FOUND libbenchmark-dev "Google Benchmark")
endif()
find_package(ZLIB QUIET)
kiln_require(ZLIB_FOUND zlib1g-dev "zlib (reads .gz datasets)")
find_package(nlohmann_json CONFIG QUIET)
kiln_require(nlohmann_json_FOUND nlohmann-json3-dev "nlohmann-json")

# The tokenizers (text/): PCRE2 for the pre-tokenizers' Unicode regexes, libsentencepiece for
# tokenizer.model files, utf8proc for the NFC/NFKC normalizers. Imported targets, so that a static
# libkiln's exported link interface can name them (kilnConfig.cmake defines them again).
function(kiln_find_text_lib target lib header pkg what)
  find_library(KILN_${target}_LIB NAMES ${lib} PATHS ${KILN_DEPS_ROOT}/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  find_path(KILN_${target}_INCLUDE NAMES ${header} PATHS ${KILN_DEPS_ROOT}/usr/include)
  if(NOT KILN_${target}_LIB OR NOT KILN_${target}_INCLUDE)
    kiln_require(FALSE ${pkg} "${what}")
  endif()
  if(NOT TARGET kiln::${target})
    add_library(kiln::${target} UNKNOWN IMPORTED GLOBAL)
    set_target_properties(kiln::${target} PROPERTIES IMPORTED_LOCATION ${KILN_${target}_LIB}
                                                     INTERFACE_INCLUDE_DIRECTORIES ${KILN_${target}_INCLUDE})
  endif()
endfunction()
kiln_find_text_lib(pcre2 pcre2-8 pcre2.h libpcre2-dev "PCRE2 (the tokenizers' regexes)")
kiln_find_text_lib(sentencepiece sentencepiece sentencepiece_processor.h libsentencepiece-dev "SentencePiece (tokenizer.model files)")
kiln_find_text_lib(utf8proc utf8proc utf8proc.h libutf8proc-dev "utf8proc (Unicode normalization for the tokenizers)")

# MPI for kiln::dist (KILN_WITH_MPI: auto = when found). Open MPI from Debian: libopenmpi-dev, openmpi-bin.
set(KILN_MPI_ENABLED OFF)
if(KILN_WITH_MPI STREQUAL "auto" OR KILN_WITH_MPI)
  # The C API through the C++ compiler (kiln is a C++ project); not MPI's deprecated C++ bindings.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(KILN_MPI_ENABLED ON)
    message(STATUS "kiln: kiln::dist over MPI ${MPI_CXX_VERSION} (${MPI_CXX_LIB_NAMES})")
  elseif(KILN_WITH_MPI STREQUAL "auto")
    message(STATUS "kiln: MPI not found (libopenmpi-dev): kiln::dist is a one-process group")
  else()
    kiln_require(MPI_CXX_FOUND libopenmpi-dev "MPI for kiln::dist (or configure with -DKILN_WITH_MPI=OFF)")
  endif()
endif()
