# Configures chorus (no tests, examples or benchmark: quick) and installs it without building:
# the install must stop with "chorus: build before installing: cmake --build <dir>", which the
# test's PASS_REGULAR_EXPRESSION looks for.
#   cmake -DCHORUS_SOURCE_DIR=<checkout> -DWORK_DIR=<scratch> [-DGENERATOR=Ninja] [-DCXX_COMPILER=...] -P install_before_build.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
if(NOT GENERATOR)
    set(GENERATOR Ninja)
endif()
set(_configure "${CMAKE_COMMAND}" -S "${CHORUS_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_EXAMPLES=OFF -DCHORUS_BUILD_BENCH=OFF -DCHORUS_INSTALL=ON)
if(CXX_COMPILER)
    list(APPEND _configure "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
execute_process(COMMAND ${_configure} RESULT_VARIABLE _rc OUTPUT_QUIET)
if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "configure failed: ${_rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${WORK_DIR}/build" --prefix "${WORK_DIR}/prefix"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(_rc EQUAL 0)
    message(FATAL_ERROR "cmake --install of an unbuilt tree succeeded")
endif()
