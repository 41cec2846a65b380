# Builds and runs one consumer project of tests/package/ against this chorus checkout.
#
#   cmake -DKIND=find_package|add_subdirectory|fetchcontent
#         -DCHORUS_SOURCE_DIR=<checkout> -DCHORUS_BINARY_DIR=<configured chorus build>
#         -DWORK_DIR=<scratch dir, deleted first> [-DGENERATOR=Ninja] [-DCXX_COMPILER=...]
#         [-DMAKE_PROGRAM=...] [-DWITH_ASIO=ON] [-DHIDE_ASIO=ON]   (find_package only:
#         the consumer's find_package(Asio) finds nothing, as on a machine without Asio)
#         [-DCUDA_COMPILER=<nvcc> -DCUDA_ARCHITECTURES=...] -P run.cmake   (find_package only)

foreach(_var IN ITEMS KIND CHORUS_SOURCE_DIR WORK_DIR)
    if(NOT ${_var})
        message(FATAL_ERROR "run.cmake: pass -D${_var}=...")
    endif()
endforeach()
if(NOT KIND MATCHES "^(find_package|add_subdirectory|fetchcontent)$")
    message(FATAL_ERROR "run.cmake: unknown KIND '${KIND}'")
endif()
if(NOT GENERATOR)
    set(GENERATOR Ninja)
endif()
if(NOT DEFINED WITH_ASIO)
    set(WITH_ASIO ON)
endif()

# Runs a command, echoing it, and stops the script on any failure.
function(run_step what)
    string(REPLACE ";" " " _pretty "${ARGN}")
    message(STATUS "[${KIND}] ${what}: ${_pretty}")
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "[${KIND}] ${what} failed: ${_rc}")
    endif()
endfunction()

# A fresh directory: leftovers (a stale cache, an old install) must not make a rerun pass.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# The consumer's build follows chorus' own: same compiler and generator. Release only, and
# one fixed output dir (the _RELEASE form gets no per-config subdir, even from multi-config
# generators), so the executable's path is known.
set(_configure
    "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/${KIND}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_RUNTIME_OUTPUT_DIRECTORY_RELEASE=${WORK_DIR}/bin"
    "-DCHORUS_EXPECT_TCP=${WITH_ASIO}")
if(CXX_COMPILER)
    list(APPEND _configure "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(MAKE_PROGRAM)
    list(APPEND _configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

if(CUDA_COMPILER)
    if(NOT KIND STREQUAL "find_package")
        message(FATAL_ERROR "run.cmake: the CUDA consumer is built with KIND=find_package only")
    endif()
    # CUDA_ARCHITECTURES stays "|"-joined down to the consumer: a list would split commands.
    list(APPEND _configure -DCHORUS_EXPECT_CUDA=ON "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}"
        "-DCHORUS_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}")
endif()

if(KIND STREQUAL "find_package")
    if(NOT CHORUS_BINARY_DIR)
        message(FATAL_ERROR "run.cmake: find_package needs -DCHORUS_BINARY_DIR=...")
    endif()
    run_step("install" "${CMAKE_COMMAND}" --install "${CHORUS_BINARY_DIR}" --prefix "${WORK_DIR}/prefix")
    # Only the fresh private prefix may supply chorus, not the user package registry.
    list(APPEND _configure "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
    if(HIDE_ASIO)
        list(APPEND _configure -DCMAKE_DISABLE_FIND_PACKAGE_Asio=TRUE)
    endif()
else()
    list(APPEND _configure "-DCHORUS_SOURCE_DIR=${CHORUS_SOURCE_DIR}" "-DCHORUS_WITH_ASIO=${WITH_ASIO}")
endif()

run_step("configure" ${_configure})
run_step("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" --config Release)
set(_exe_suffix "")
if(CMAKE_HOST_WIN32)
    set(_exe_suffix ".exe")
endif()
run_step("run" "${WORK_DIR}/bin/consumer${_exe_suffix}")
if(WITH_ASIO)
    run_step("run" "${WORK_DIR}/bin/consumer_tcp${_exe_suffix}")
endif()
if(CUDA_COMPILER)
    # Two ranks under the installed launcher. Without a GPU the program says so and exits 77:
    # the package was still installed, found, compiled and linked, which is what this tests.
    set(_launch "${WORK_DIR}/prefix/bin/chorusrun" -n 2 --timeout-ms 60000 "${WORK_DIR}/bin/consumer_cuda")
    message(STATUS "[${KIND}] run: ${_launch}")
    execute_process(COMMAND ${_launch} RESULT_VARIABLE _rc)
    if(_rc EQUAL 77)
        message(STATUS "[${KIND}] consumer_cuda built and linked; not run: no usable GPU")
    elseif(NOT _rc EQUAL 0)
        message(FATAL_ERROR "[${KIND}] consumer_cuda failed: ${_rc}")
    endif()
endif()
