# Floors only go down (docs/architecture.md): an #include of <kiln/ROOM/...> from a library file must
# name its own room or a room on a lower floor. Run: cmake -DROOT=<source tree> -P check_floors.cmake
# It lists every offending include (file:line, both rooms and floors) and fails if there is one.
#
#   floor 0: core
#   floor 1: backends
#   floor 2: autograd, formats, text     (side by side: neither includes the other)
#   floor 3: nn, optim                   (side by side)
#   floor 4: dist
#   floor 5: train
# The generated headers <kiln/config.hpp> and <kiln/version.hpp> sit below every floor; the umbrella
# kiln.hpp, examples/, bench/, fuzz/ and tests/ stand above them all and are not checked.
if(NOT ROOT)
  message(FATAL_ERROR "check_floors: pass -DROOT=<source tree>")
endif()
set(floor_core 0)
set(floor_backends 1)
set(floor_autograd 2)
set(floor_formats 2)
set(floor_text 2)
set(floor_nn 3)
set(floor_optim 3)
set(floor_dist 4)
set(floor_train 5)
set(rooms core backends autograd formats text nn optim dist train)

set(bad "")
set(files 0)
foreach(room ${rooms})
  if(NOT IS_DIRECTORY ${ROOT}/${room})
    continue()
  endif()
  file(GLOB_RECURSE sources RELATIVE ${ROOT} ${ROOT}/${room}/*.hpp ${ROOT}/${room}/*.cpp ${ROOT}/${room}/*.cu
       ${ROOT}/${room}/*.cuh ${ROOT}/${room}/*.h)
  foreach(f ${sources})
    math(EXPR files "${files} + 1")
    file(STRINGS ${ROOT}/${f} lines)
    set(n 0)
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]kiln/([a-z_]+)[/.]")
        set(to ${CMAKE_MATCH_1})
        if(to STREQUAL room OR to STREQUAL "config" OR to STREQUAL "version")
          continue()
        endif()
        if(NOT DEFINED floor_${to})
          string(APPEND bad "  ${f}:${n}: includes kiln/${to}/, which is no room of the library\n")
        elseif(NOT floor_${to} LESS floor_${room})
          string(STRIP "${line}" inc)
          string(APPEND bad "  ${f}:${n}: ${inc}: ${room} (floor ${floor_${room}}) reaches ${to} (floor ${floor_${to}})\n")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()
if(files EQUAL 0)
  message(FATAL_ERROR "check_floors: no source file under ${ROOT}/{${rooms}}")
endif()
if(bad)
  message(FATAL_ERROR "check_floors: includes going up or across a floor:\n${bad}")
endif()
message(STATUS "check_floors: ${files} files, every include goes down a floor")
