# chorus_add_header_checks(<target>)
#
# Compiles every public header on its own, so the build fails if a header is not
# self-contained (it relies on something an earlier #include happened to provide). Each
# header gets a generated TU that includes it twice: the second inclusion checks the
# include guard / #pragma once.
#
# <target> is an OBJECT library with the core headers, linked to chorus::chorus only, so a
# core header cannot lean on Asio or CUDA include paths. Headers of optional transports are
# checked only when their target exists, each in <target>_<name> linked to that target;
# building <target> builds those too.

function(chorus_add_header_checks target)
    # The function's own file, not the caller's: works from any directory.
    cmake_path(SET _root NORMALIZE "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include")
    file(GLOB_RECURSE _headers CONFIGURE_DEPENDS RELATIVE "${_root}" "${_root}/chorus/*.hpp")
    list(SORT _headers)

    # Optional headers: header => the target it needs.
    set(_optional chorus/transport/tcp.hpp chorus/transport/tcp_impl.hpp chorus/transport/cuda_ipc.hpp)
    set(_needs_chorus/transport/tcp.hpp chorus::tcp)
    set(_needs_chorus/transport/tcp_impl.hpp chorus::tcp)
    set(_needs_chorus/transport/cuda_ipc.hpp chorus::cuda_ipc)

    set(_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}")
    add_library(${target} OBJECT)
    target_link_libraries(${target} PRIVATE chorus::chorus chorus_test_flags)

    foreach(_header IN LISTS _headers)
        set(_lib ${target})
        if(_header IN_LIST _optional)
            set(_dep "${_needs_${_header}}")
            if(NOT TARGET ${_dep})
                continue()
            endif()
            cmake_path(GET _header STEM _stem)
            set(_lib ${target}_${_stem})
            add_library(${_lib} OBJECT)
            target_link_libraries(${_lib} PRIVATE chorus::chorus ${_dep} chorus_test_flags)
            add_dependencies(${target} ${_lib})
        endif()
        string(MAKE_C_IDENTIFIER "${_header}" _name)
        # file(CONFIGURE) rewrites only on change, so reconfiguring does not force rebuilds.
        file(CONFIGURE OUTPUT "${_dir}/${_name}.cpp"
             CONTENT "#include <${_header}>\n#include <${_header}> // again: the guard must make this a no-op\n")
        target_sources(${_lib} PRIVATE "${_dir}/${_name}.cpp")
    endforeach()

    # With CHORUS_TCP_SEPARATE_COMPILATION, tcp.hpp must compile without Asio at all: that
    # is its point. Checked against chorus::chorus alone.
    if(TARGET chorus::tcp)
        add_library(${target}_tcp_separate OBJECT)
        target_link_libraries(${target}_tcp_separate PRIVATE chorus::chorus chorus_test_flags)
        target_compile_definitions(${target}_tcp_separate PRIVATE CHORUS_TCP_SEPARATE_COMPILATION)
        file(CONFIGURE OUTPUT "${_dir}/tcp_separate.cpp"
             CONTENT "#include <chorus/transport/tcp.hpp>\n#ifdef ASIO_VERSION\n#error tcp.hpp pulled in Asio\n#endif\n")
        target_sources(${target}_tcp_separate PRIVATE "${_dir}/tcp_separate.cpp")
        add_dependencies(${target} ${target}_tcp_separate)
    endif()
endfunction()
