# kiln_avx512_check(OUT ARCH_FLAG): the flags that make this compiler's AVX-512 code right, in OUT.
# GCC 12 miscompiles some 256-bit constants once AVX-512 is on (cmake/gcc12_avx512_check.cpp says how);
# kiln's AVX-512 code is the whole library in a native build on an AVX-512 machine, and the AVX-512
# kernel variants (backends/cpu/common.hpp) in every build. The check compiles the reproducer as kiln
# compiles its AVX-512 code (-O3, ARCH_FLAG, a target region) and runs it:
#  * right: no flag;
#  * wrong: the narrowest fix, -mtune-ctrl=^inter_unit_moves_to_vec (it turns the broadcast rewrite
#    off, and with it only direct moves from integer to vector registers, a tuning choice), when the
#    reproducer built with it is right; else the last resort: no AVX-512 at all (-mno-avx512f for the
#    native build, and KILN_CPU_NO_AVX512, which keeps the AVX-512 kernel variants from being chosen);
#  * not runnable here (no AVX-512 on this CPU, cross-compiling): GCC 12 gets the fix unchecked (a
#    tuning knob: correctness never depends on it), other compilers nothing.
# The result is cached (KILN_AVX512_FLAGS) per compiler, -march and CXXFLAGS.
function(kiln_avx512_check out arch_flag)
  set(key "${CMAKE_CXX_COMPILER};${CMAKE_CXX_COMPILER_VERSION};${arch_flag};${CMAKE_CXX_FLAGS}")
  if(DEFINED CACHE{KILN_AVX512_FLAGS} AND "${KILN_AVX512_CHECK_KEY}" STREQUAL "${key}")
    set(${out} "${KILN_AVX512_FLAGS}" PARENT_SCOPE)
    return()
  endif()
  set(flags "")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(src ${PROJECT_SOURCE_DIR}/cmake/gcc12_avx512_check.cpp)
    set(fix -mtune-ctrl=^inter_unit_moves_to_vec)
    set(dir ${PROJECT_BINARY_DIR}/CMakeFiles/kiln_avx512_check)
    try_run(run compiled ${dir} ${src} COMPILE_DEFINITIONS -O3 ${arch_flag} RUN_OUTPUT_VARIABLE said
            COMPILE_OUTPUT_VARIABLE log)
    if(compiled AND run EQUAL 0)
      set(verdict "right")
    elseif(compiled AND run EQUAL 1)
      try_run(run_fixed compiled_fixed ${dir} ${src} COMPILE_DEFINITIONS -O3 ${arch_flag} ${fix} RUN_OUTPUT_VARIABLE said_fixed)
      if(compiled_fixed AND run_fixed EQUAL 0)
        set(flags ${fix})
        set(verdict "miscompiled; right with ${fix}")
      else()
        set(flags -DKILN_CPU_NO_AVX512=1)
        if(arch_flag STREQUAL "-march=native")
          list(APPEND flags -mno-avx512f)
        endif()
        set(verdict "miscompiled, also with ${fix}: no AVX-512")
      endif()
    elseif(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12 AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      set(flags ${fix})
      set(verdict "not run here (${said}); GCC 12: ${fix} unchecked")
    else()
      set(verdict "not run here (${said})")
    endif()
    string(STRIP "${verdict}" verdict)
    message(STATUS "kiln: GCC AVX-512 constant broadcast check (cmake/gcc12_avx512_check.cpp): ${verdict}")
  endif()
  set(KILN_AVX512_FLAGS "${flags}" CACHE STRING "Flags from the GCC 12 AVX-512 check (cmake/KilnAvx512Check.cmake)" FORCE)
  set(KILN_AVX512_CHECK_KEY "${key}" CACHE INTERNAL "")
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()
