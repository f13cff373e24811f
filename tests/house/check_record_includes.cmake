# Fails when a source file outside autograd/ includes kiln/autograd/record.hpp: every derivative is
# recorded in autograd/ops/<family>.cpp (DESIGN §1, §3); nn/ and the rest compose those ops.
#   cmake -DROOT=<source tree> -P check_record_includes.cmake
# Build trees, hidden folders (.git, .venv-hf) and _deps under ROOT are skipped; links are not followed.
cmake_minimum_required(VERSION 3.20)  # policies NEW: GLOB_RECURSE does not follow symlinks
if(NOT ROOT)
  message(FATAL_ERROR "check_record_includes: pass -DROOT=<source tree>")
endif()
file(GLOB_RECURSE files RELATIVE ${ROOT} ${ROOT}/*.hpp ${ROOT}/*.cpp ${ROOT}/*.h ${ROOT}/*.cc ${ROOT}/*.cu ${ROOT}/*.cuh)
set(bad "")
set(n 0)
foreach(f ${files})
  if(f MATCHES "^(autograd/|build[^/]*/|\\.|_deps/)")
    continue()
  endif()
  math(EXPR n "${n} + 1")
  file(STRINGS ${ROOT}/${f} hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](kiln/)?autograd/record\\.hpp[>\"]")
  if(hits)
    list(APPEND bad ${f})
  endif()
endforeach()
if(bad)
  list(JOIN bad "\n  " listed)
  message(FATAL_ERROR "autograd/record.hpp is internal to autograd/ (put the op and its backward in autograd/ops/<family>.cpp), "
                      "but these files include it:\n  ${listed}")
endif()
if(n EQUAL 0)
  message(FATAL_ERROR "check_record_includes: no source files under ${ROOT}")
endif()
message(STATUS "record.hpp: included only in autograd/ (${n} other source files checked)")
