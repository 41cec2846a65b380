# Install rules and the CMake package for chorus, included from the top-level
# CMakeLists.txt when CHORUS_INSTALL is ON.
#
# Header-only and architecture independent, so the package goes to DATADIR (share/), not
# LIBDIR: one install serves every ABI.

include(CMakePackageConfigHelpers)

set(_chorus_targets chorus)
if(TARGET chorus_tcp)
    list(APPEND _chorus_targets chorus_tcp)
endif()
if(TARGET chorusrun)
    list(APPEND _chorus_targets chorusrun)  # chorus::chorusrun for consumers' tests
endif()
set(_chorus_cmakedir "${CMAKE_INSTALL_DATADIR}/cmake/chorus")

# `cmake --install` right after configuring would fail deep inside with "cannot find
# .../chorusrun": say what to do instead, first.
if(TARGET chorusrun)
    install(CODE "if(NOT EXISTS \"$<TARGET_FILE:chorusrun>\")
    message(FATAL_ERROR \"chorus: build before installing: cmake --build ${PROJECT_BINARY_DIR} (the package includes the chorusrun launcher)\")
endif()")
endif()
install(TARGETS ${_chorus_targets} EXPORT chorus-targets RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/chorus" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT chorus-targets
    NAMESPACE chorus::
    FILE chorus-targets.cmake
    DESTINATION "${_chorus_cmakedir}")

# SameMinorVersion: while chorus is 0.x, a minor bump may break the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/chorus-config-version.cmake"
    COMPATIBILITY SameMinorVersion
    ARCH_INDEPENDENT)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/chorus-config.cmake.in"
    "${PROJECT_BINARY_DIR}/chorus-config.cmake"
    INSTALL_DESTINATION "${_chorus_cmakedir}")

set(_chorus_package_files
    "${PROJECT_BINARY_DIR}/chorus-config.cmake"
    "${PROJECT_BINARY_DIR}/chorus-config-version.cmake")
if(CHORUS_WITH_ASIO)
    # The config file finds Asio with our module: Asio has no package of its own.
    list(APPEND _chorus_package_files "${PROJECT_SOURCE_DIR}/cmake/FindAsio.cmake")
    # Also beside the build-tree config, so -Dchorus_DIR=<build dir> works too.
    configure_file("${PROJECT_SOURCE_DIR}/cmake/FindAsio.cmake" "${PROJECT_BINARY_DIR}/FindAsio.cmake" COPYONLY)
    # chorus::tcp_compiled and chorus::cuda_ipc are defined in the consumer's build from these
    # two (the engine's one-line .cpp is compiled there): no binary in the package.
    list(APPEND _chorus_package_files "${PROJECT_SOURCE_DIR}/cmake/chorus-compiled-targets.cmake" "${_chorus_tcp_impl}")
    configure_file("${PROJECT_SOURCE_DIR}/cmake/chorus-compiled-targets.cmake" "${PROJECT_BINARY_DIR}/chorus-compiled-targets.cmake" COPYONLY)
endif()
install(FILES ${_chorus_package_files} DESTINATION "${_chorus_cmakedir}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DOCDIR}")

# Build-tree package: the build directory can be used as chorus_DIR without installing.
export(EXPORT chorus-targets
    FILE "${PROJECT_BINARY_DIR}/chorus-targets.cmake"
    NAMESPACE chorus::)
