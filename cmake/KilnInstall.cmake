# `cmake --install build --prefix P` puts:
#   P/lib/libkiln.so.MAJOR.MINOR (SONAME) and its links, or libkiln.a    P/bin/kiln
#   P/include/kiln/...  the public headers, as <kiln/nn/linear.hpp> etc. (kiln.hpp: all of them)
#   P/lib/cmake/kiln/   kilnConfig.cmake, kilnConfigVersion.cmake, kilnTargets*.cmake (kiln::kiln)
#   P/lib/pkgconfig/kiln.pc          P/share/doc/kiln/ (README, tutorial, formats, specs)
# Every path inside is relative to the file that holds it, so the prefix can be moved.
# `cpack -G DEB` (scripts/package.sh) makes the Debian package from the same rules.
include(CMakePackageConfigHelpers)
set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

install(TARGETS kiln EXPORT kilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The reference pages users need without the repository (kiln --help points to them).
install(FILES ${PROJECT_SOURCE_DIR}/docs/formats.md ${PROJECT_SOURCE_DIR}/docs/specs.md ${PROJECT_SOURCE_DIR}/docs/tutorial.md
        ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# Public headers: every .hpp of the library's folders but these, which are the backends' insides.
set(KILN_PRIVATE_HEADERS backends/cpu/common.hpp backends/cpu/vecmath.hpp backends/cuda/runtime.hpp dist/detail.hpp dist/mpi.hpp text/detail.hpp
                         backends/cuda/testing.hpp formats/json_fields.hpp core/env.hpp text/regex.hpp)
set(KILN_PUBLIC_HEADERS)
foreach(d ${KILN_HEADER_DIRS})
  file(GLOB_RECURSE hs RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${d}/*.hpp)
  list(APPEND KILN_PUBLIC_HEADERS ${hs})
endforeach()
list(REMOVE_ITEM KILN_PUBLIC_HEADERS ${KILN_PRIVATE_HEADERS})
if(NOT KILN_CUDA_ENABLED)
  list(FILTER KILN_PUBLIC_HEADERS EXCLUDE REGEX "^backends/cuda/")
endif()
foreach(h ${KILN_PUBLIC_HEADERS})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${dir})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/kiln.hpp ${KILN_INCLUDE_DIR}/kiln/version.hpp ${KILN_INCLUDE_DIR}/kiln/config.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
# The list, for the test that compiles each public header on its own (tests/install).
list(APPEND KILN_PUBLIC_HEADERS kiln.hpp version.hpp config.hpp)
string(REPLACE ";" "\n" _kiln_list "${KILN_PUBLIC_HEADERS}")
file(WRITE ${PROJECT_BINARY_DIR}/kiln_public_headers.txt "${_kiln_list}\n")

# CMake package
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# 0.x: a minor version may change the interface, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake DESTINATION ${KILN_CMAKE_DIR})

# pkg-config: paths relative to the .pc file (${pcfiledir}); a run path to libdir outside /usr.
file(RELATIVE_PATH KILN_PC_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" KILN_PC_PREFIX "${KILN_PC_PREFIX}")
set(KILN_PC_RPATH "")
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(KILN_PC_RPATH " -Wl,-rpath,\${libdir}")
endif()
set(KILN_PC_LIBS_PRIVATE "")
if(NOT KILN_SHARED)
  set(KILN_PC_LIBS_PRIVATE "Libs.private: -fopenmp ${KILN_OPENBLAS_LIB} -lz -lpcre2-8 -lsentencepiece -lutf8proc")
  if(KILN_WITH_ONEDNN)
    string(APPEND KILN_PC_LIBS_PRIVATE " -ldnnl")
  endif()
endif()
# A sanitized libkiln (KILN_SANITIZE) loads only into programs that link the sanitizer runtimes (ASan
# must come first in the library list): the installed package links its users with them.
set(KILN_PC_SANITIZE "")
if(KILN_SANITIZE)
  target_link_options(kiln INTERFACE $<INSTALL_INTERFACE:-fsanitize=address,undefined>)
  set(KILN_PC_SANITIZE " -fsanitize=address,undefined")
endif()
configure_file(cmake/kiln.pc.in ${PROJECT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Debian package: cpack -G DEB in a build configured for it (scripts/package.sh: -DKILN_NATIVE=OFF,
# prefix /usr). Depends: the shared libraries' packages (dpkg-shlibdeps) and what the public headers
# and the CMake package need to build a user's program.
set(CPACK_PACKAGE_NAME kiln)
set(CPACK_PACKAGE_VENDOR "kiln")
set(CPACK_PACKAGE_CONTACT "kiln developers <kiln@invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "kiln: a deep learning framework in C++20 (library, headers, CMake package, kiln command)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfmt-dev, nlohmann-json3-dev, libopenblas0-openmp")
set(CPACK_STRIP_FILES ON)
include(CPack)
